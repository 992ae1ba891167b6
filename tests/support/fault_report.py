"""The fault harness's outcomes as a table (printed and written to var/faults/NAME.txt), the
summary per scenario and fault kind, and the assertion a test makes of them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tests.support.processes import PROJECT_ROOT

if TYPE_CHECKING:
    from tests.support.fault_harness import Outcome

REPORT_DIR = PROJECT_ROOT / "var" / "faults"


def table(outcomes: list[Outcome]) -> str:
    """Every (scenario, round trip, fault) run and its outcome, one line each."""
    lines = [
        f"{'scenario':<10} {'fault':<12} {'#':>3} {'conn':>4} {'st':<2} {'occ':>3} "
        f"{'exit':>4}  {'statement':<64} {'time':>6} outcome"
    ]
    for outcome in outcomes:
        trip, fault = outcome.trip, outcome.fault
        lines.append(
            f"{outcome.scenario:<10} {fault.kind if fault else 'none':<12} "
            f"{trip.seq if trip else '-':>3} {trip.connection if trip else '-':>4} "
            f"{trip.status if trip else '-':<2} {trip.occurrence if trip else '-':>3} "
            f"{'hung' if outcome.exit is None else outcome.exit:>4}  "
            f"{(trip.statement if trip else '(clean run)')[:64]:<64} "
            f"{sum(outcome.seconds.values()):5.1f}s {outcome.result}"
        )
    return "\n".join(lines)


def assert_held(outcomes: list[Outcome], *, all_fired: bool = True) -> None:
    """No run broke an invariant, and (`all_fired`: a named case) every fault fired. In an
    enumeration a round trip of a timer thread (a lease renewal) may not come again in the
    faulted run: it is listed `ok (not reached)` in the table."""
    if all_fired:
        assert [o.fault for o in outcomes if o.fault and not o.fired] == [], "a fault never fired"
    broken = [(o.fault, o.violations, o.log) for o in outcomes if o.violations]
    assert broken == [], broken


def report(name: str, outcomes: list[Outcome]) -> str:
    """Print the table and write it to var/faults/NAME.txt; return it."""
    text = table(outcomes)
    summary = summarize(outcomes)
    text += "\n\n" + "\n".join(
        f"{scenario} {kind}: {covered} round trips, {violations} violations"
        for (scenario, kind), (covered, violations) in sorted(summary.items())
    )
    REPORT_DIR.mkdir(parents=True, exist_ok=True)
    (REPORT_DIR / f"{name}.txt").write_text(text + "\n")
    print(text)
    return text


def summarize(outcomes: list[Outcome]) -> dict[tuple[str, str], tuple[int, int]]:
    """(scenario, fault kind) -> (round trips faulted, runs with a violation)."""
    summary: dict[tuple[str, str], tuple[int, int]] = {}
    for outcome in outcomes:
        if outcome.fault is None:
            continue
        key = (outcome.scenario, outcome.fault.kind)
        covered, violations = summary.get(key, (0, 0))
        summary[key] = (covered + 1, violations + bool(outcome.violations))
    return summary
