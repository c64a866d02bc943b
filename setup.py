"""The native decoder's build (pyproject.toml holds everything else): `pip install .`
and `pip install -e .` compile app/receive/_otlpdecode.c into app.receive._otlpdecode."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "app.receive._otlpdecode",
            sources=["app/receive/_otlpdecode.c"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Werror=implicit-function-declaration"],
            optional=False,
        )
    ]
)
