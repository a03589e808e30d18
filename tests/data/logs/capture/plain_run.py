# ruff: noqa: E702 -- kept as run to capture the fixture beside it (see ../README.md)
# A training loop with plain prints, as many scripts write them (numpy logistic regression).
import numpy as np

rng = np.random.default_rng(0)
x = rng.normal(size=(512, 8)); w_true = rng.normal(size=8); y = (x @ w_true > 0).astype(float)
w = np.zeros(8)
for step in range(1, 201):
    idx = rng.integers(0, 512, 32)
    p = 1 / (1 + np.exp(-(x[idx] @ w)))
    loss = -np.mean(y[idx] * np.log(p + 1e-9) + (1 - y[idx]) * np.log(1 - p + 1e-9))
    w -= 0.1 * x[idx].T @ (p - y[idx]) / 32
    if step % 10 == 0:
        print(f"step={step} loss={loss:.4f} lr=0.1", flush=True)
