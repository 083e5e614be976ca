"""Only the compiled float backend of the fair-share update; everything else is in
pyproject.toml. ``optional``: without a C compiler the install still succeeds and the float
backend runs the same algorithm in Python (``fairpool.engine.fairshare.kernel`` is None)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "fairpool.engine._hdrf",
            ["fairpool/engine/_hdrf.c"],
            # No fused multiply-adds (the default where the CPU has them, e.g. arm64): the
            # kernel must round exactly as the Python code does.
            extra_compile_args=["-ffp-contract=off"],
            optional=True,
        )
    ]
)
