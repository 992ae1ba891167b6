"""The handler registry: discovery of <app>.handlers, extra modules, conflicting kinds."""

from __future__ import annotations

import importlib.util
import sys

import pytest
from django.apps import apps
from django.core.exceptions import ImproperlyConfigured

from jobs import handler
from jobs.exceptions import UnknownJobKind
from jobs.registry import discover, get_handler, registered_kinds


def test_discovery_imports_every_installed_apps_handlers_module():
    discover()
    for config in apps.get_app_configs():
        module = f"{config.name}.handlers"
        if importlib.util.find_spec(module) is not None:
            assert module in sys.modules


def test_a_kind_cannot_get_a_second_different_handler():
    @handler("tests.registry.once")
    def first(payload: dict) -> None:
        pass

    handler("tests.registry.once")(first)  # the same function again: fine (re-import)
    with pytest.raises(ImproperlyConfigured, match="already has a handler"):

        @handler("tests.registry.once")
        def second(payload: dict) -> None:
            pass

    assert get_handler("tests.registry.once") is first
    assert "tests.registry.once" in registered_kinds()


def test_unknown_kind_is_a_permanent_error_naming_the_kind():
    with pytest.raises(UnknownJobKind, match="'nope'"):
        get_handler("nope")
