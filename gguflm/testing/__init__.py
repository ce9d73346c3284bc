"""Helpers for testing code built on gguflm's kernels.

:mod:`gguflm.testing.strategies` holds hypothesis strategies (adversarial float rows, valid random
quantized blocks of every format, matmul shapes); importing it needs the ``hypothesis`` package.
"""
