"""Packaging that pyproject.toml cannot say: the checkout's top-level ``conf/`` ships inside the
wheel and the sdist as the package ``fxtrack.conf`` (setuptools' package-dir mapping; its YAML
files are package data, listed in pyproject.toml). Everything else is in pyproject.toml."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["fxtrack", "fxtrack.*"]), "fxtrack.conf"],
    package_dir={"fxtrack.conf": "conf"},
)
