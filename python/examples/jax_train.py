#!/usr/bin/env python3
"""Feeding a jitted JAX step from recflow, without copies.

    /usr/bin/python3 python/examples/jax_train.py DIR_OF_FASHION_MNIST_TFRECORDS

Each batch's arrays are recflow.Array (numpy arrays sharing the C++ batch's
memory); jax.dlpack.from_dlpack takes them through __dlpack__ on the CPU
backend.  JAX is not packaged by Debian 12, so this example is not run by
the tests here (docs/PYTHON.md says so); the same batches feed PyTorch in
tests/python/test_torch.py.
"""

import sys

import jax
import jax.dlpack
import jax.numpy as jnp

import recflow

SPEC = {"image": recflow.FixedLenFeature([], "bytes"),
        "label": recflow.FixedLenFeature([], "int64")}


def init(key):
    k1, k2 = jax.random.split(key)
    return {"w1": jax.random.normal(k1, (784, 128)) * 0.05,
            "b1": jnp.zeros(128),
            "w2": jax.random.normal(k2, (128, 10)) * 0.05,
            "b2": jnp.zeros(10)}


def loss_fn(params, x, y):
    h = jax.nn.relu(x @ params["w1"] + params["b1"])
    logits = h @ params["w2"] + params["b2"]
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits),
                                         y[:, None], axis=1))


@jax.jit
def step(params, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    return jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params,
                                  grads), loss


def main():
    ds = (recflow.Dataset.from_tfrecords(sys.argv[1])
          .shuffle(10_000, seed=0).batch(128, drop_remainder=True)
          .parse(SPEC)
          .map(recflow.maps.decode_raw("image", "uint8", [784]))
          .map(recflow.maps.scale("image", 1 / 255))
          .map(recflow.maps.cast("label", "int32"))
          .prefetch(2))
    params = init(jax.random.PRNGKey(0))
    for i, batch in enumerate(ds):
        x = jax.dlpack.from_dlpack(batch["image"])
        y = jax.dlpack.from_dlpack(batch["label"])
        params, loss = step(params, x, y)
        if i % 100 == 0:
            print(f"step {i}: loss {float(loss):.3f}")


if __name__ == "__main__":
    main()
