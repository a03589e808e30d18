# ruff: noqa: E501 -- kept as run to capture the fixture beside it (see ../README.md)
import os

os.environ.setdefault("KERAS_BACKEND", "jax")
import keras
import numpy as np

rng = np.random.default_rng(0)
x = rng.normal(size=(512, 8)).astype("float32")
y = (x @ rng.normal(size=(8, 1)) > 0).astype("float32")
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1, activation="sigmoid")])
model.compile(optimizer=keras.optimizers.SGD(0.1), loss="binary_crossentropy")
model.fit(x, y, epochs=5, batch_size=32, verbose=int(os.environ.get("VERBOSE", "1")))
