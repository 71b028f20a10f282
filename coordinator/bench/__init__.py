"""``coordinator bench``: AR, local SD and remote SD over each backend and worker, in one run.

``plan`` decides the rows, ``runner`` measures them (interleaved, so every
row sees the same machine state), ``summary`` turns the raw runs into the
figures of a row, ``report`` prints and writes them, ``plot`` draws them.
"""
