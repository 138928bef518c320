"""Prepared answers in place of a running HTCondor, for tests, benchmarks and fixture scripts.

No HTCondor daemon runs on the project machine (Debian 12 has no package for it), so reads are
exercised on ads captured from real pools. These stand-ins implement the part of the ``htcondor2``
interface the backend calls — ``Collector(pool).locateAll/query`` and ``Schedd(ad).query`` — and
nothing else, so a read through them takes the backend's real code path.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def projected(ads: Iterable[Any], projection: list[str]) -> list[Any]:
    """What a schedd or collector query with this projection returns: only those attributes."""
    import classad2

    out = []
    for ad in ads:
        p = classad2.ClassAd()
        for name in projection:
            if name in ad:
                p[name] = ad.lookup(name)
        out.append(p)
    return out


class CannedCondor:
    """The bindings module as the backend sees it, answering with prepared job and slot ads.

    ``filter_jobs`` evaluates each schedd query's constraint against the job ads, as a schedd
    does (tests of the constraint); benchmarks leave it off so that the time measured is the
    backend's read, not this stand-in's filtering."""

    def __init__(self, jobs: list[Any], slots: list[Any], *, filter_jobs: bool = False) -> None:
        import htcondor2

        self.AdTypes, self.DaemonTypes = htcondor2.AdTypes, htcondor2.DaemonTypes
        self.jobs, self.slots, self.filter_jobs = jobs, slots, filter_jobs

    def Collector(self, pool: str | None = None) -> Any:  # noqa: N802 (the bindings' name)
        outer = self

        class Collector:
            def locateAll(self, daemon_type: Any) -> list[Any]:  # noqa: N802
                return [{"Name": "schedd"}]

            def query(self, ad_type: Any = None, constraint: Any = None, projection: Any = None) -> list[Any]:
                return outer.slots

        return Collector()

    def Schedd(self, ad: Any = None) -> Any:  # noqa: N802 (the bindings' name)
        outer = self

        class Schedd:
            def query(self, constraint: str = "", projection: Any = ()) -> list[Any]:
                if not outer.filter_jobs:
                    return outer.jobs
                import classad2

                test = classad2.ExprTree(constraint)
                return [a for a in outer.jobs if test.eval(a) is True]

        return Schedd()
