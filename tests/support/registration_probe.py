"""Run by tests/project/test_handler_registration.py in a pytest process of its own, in
file order: the `register` fixture is the first to touch the registry there, as it was in
stop 44's serial part, where every later test lost the handlers of our apps."""

from __future__ import annotations

from jobs.registry import registered_kinds


def test_a_test_registers_a_kind_first_in_its_process(register):
    @register("tests.probe.registered_first")
    def registered_first(payload: dict) -> None:
        pass

    assert "tests.probe.registered_first" in registered_kinds()


def test_a_later_test_still_finds_every_app_handler_and_not_the_probes_kind():
    kinds = registered_kinds()
    assert "inbound_email.relay_reply" in kinds, kinds
    assert "tests.probe.registered_first" not in kinds, kinds
