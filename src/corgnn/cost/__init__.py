"""Cost models: GCN scheme plan (Tables 1-2), GAT caching plan (Table 4), sparse I/O model (Tables 6-7),
dense-to-CSR conversion of input features."""

from .features import ConversionPlan, plan_feature_conversion
from .gat import GAT_CACHE_SCHEMES, GATCacheCost, GATPlan, bytes_saved, plan_gat
from .gatv2 import GATV2_CACHE_SCHEMES, gatv2_bytes_saved, plan_gatv2
from .gcn import GCN_SCHEMES, GCNPlan, GCNScheme, MachineModel, SchemeCost, parse_scheme, plan_gcn
from .io import FormatChoice, IOCost, MatrixStats, choose_format, io_model, operational_intensity

__all__ = [
    "GCN_SCHEMES", "GCNPlan", "GCNScheme", "MachineModel", "SchemeCost", "parse_scheme", "plan_gcn",
    "GAT_CACHE_SCHEMES", "GATCacheCost", "GATPlan", "bytes_saved", "plan_gat",
    "ConversionPlan", "plan_feature_conversion",
    "GATV2_CACHE_SCHEMES", "gatv2_bytes_saved", "plan_gatv2",
    "IOCost", "io_model", "operational_intensity", "MatrixStats", "FormatChoice", "choose_format",
]
