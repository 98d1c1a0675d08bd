"""What the scripts of ``benchmarks/`` share: experiment runners beyond the installed
package (the reference implementation's arms, latency, batch mode, route-sim), the
markdown they write and the convention of generated sections in ``docs/``.

Not installed: the scripts put this directory first on ``sys.path`` by being run as
``python benchmarks/<script>.py``; the tests add it themselves (``tests/conftest.py``).
"""
