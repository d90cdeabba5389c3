import sys, os
import corgnn.nn.base as nb
import corgnn.functional.gcn as g
mode, rows = sys.argv[3], sys.argv[4]
if mode == "dense":
    nb.SPARSE_FEATURE_DENSITY = -1.0
if rows == "off":
    g.ROWS_MIN_MACS = 1 << 62
sys.argv = sys.argv[:3]
exec(open("/tmp/cs/samp.py").read().replace('print(" ", name, lp)', 'pass'))
