"""FGD-style placement-quality replay of the Alibaba openb node and pod lists (see run_fgd.py)."""
