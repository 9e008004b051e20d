"""A chain's verdict from its links: broken > degraded > unknown > ok, and the one sentence
behind it, the same words in the API, `nicfleetctl trace` and the status page.

Pure: a function of the links. "ok" means every link (and `components`) is ok: an unknown
link is not evidence that it holds, and reduced capacity is not ok either.
"""

from __future__ import annotations

from typing import Final

from proto.http import Link, Verdict

# Evidence key of a degraded link: the adapters that reduce the capacity (RDMA devices).
DEGRADED_ADAPTERS: Final = "degraded_adapters"
COMPONENTS: Final = "components"


def verdict_of(links: tuple[Link, ...], components: Link | None) -> tuple[Verdict, str]:
    """The verdict and its reason. `components` (a precondition of every link) counts like a
    link; the reason of a broken chain names the first broken link (components first)."""
    named = [(COMPONENTS, components)] if components is not None else []
    named += [(f"link {i} ({link.name})", link) for i, link in enumerate(links)]
    broken = next(((where, link) for where, link in named if link.status == "broken"), None)
    if broken is not None:
        where, link = broken
        return "broken", f"{where}: {link.cause or 'no cause given'}"
    degraded = [link for _, link in named if link.status == "degraded"]
    if degraded:
        adapters = sorted({a for link in degraded for a in _adapters(link)})
        on = f" on {', '.join(adapters)}" if adapters else ""
        return "degraded", f"capacity reduced{on} ({', '.join(d.name for d in degraded)})"
    unknown = [link.name for _, link in named if link.status != "ok"]
    if unknown:
        count = f"{len(unknown)} link{'s' if len(unknown) > 1 else ''}"
        return "unknown", f"{count} not judged ({', '.join(unknown)}); nothing broken"
    return "ok", "every link holds"


def _adapters(link: Link) -> list[str]:
    value = link.evidence.get(DEGRADED_ADAPTERS)
    return [str(a) for a in value] if isinstance(value, list | tuple) else []
