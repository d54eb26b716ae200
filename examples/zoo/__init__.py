"""The example zoo: small, real architectures with deterministic seeded weights.

Each module is self-contained (pure ``jax.numpy`` / ``jax.lax``, no flax) and defines
``init_params(key, width)``, ``apply(params, *inputs)`` and
``export_spec(seed=..., width=..., batch_sizes=...) -> ExportSpec``, so any of them
exports with::

    reactantserver export examples/zoo/mlp.py:export_spec --out examples/repo/mlp

``examples/build_repo.py`` exports them all (plus seeded variants) into a repository.
"""
