"""The real processes tests start: command lines (``cli``), workers, ``coordinator serve``, the delay relay,
the zygote they are forked from (``zygote``), and each test process's network namespace (``isolation``)."""
