"""Cost models: GCN scheme plan (Tables 1-2), sparse I/O model (Tables 6-7)."""

from .gcn import GCN_SCHEMES, GCNPlan, GCNScheme, MachineModel, SchemeCost, parse_scheme, plan_gcn

__all__ = ["GCN_SCHEMES", "GCNPlan", "GCNScheme", "MachineModel", "SchemeCost", "parse_scheme", "plan_gcn"]
