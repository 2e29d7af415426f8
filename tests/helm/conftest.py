from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from helm_render import CHART_DIR, SCENARIOS, Release, render, scenario_values


@pytest.fixture(scope="session")
def helm() -> Any:
    """helm-python-sdk, skipping only when its bundled Go library cannot load here."""
    try:
        import helm_python
    except ImportError:
        raise  # a missing test dependency is a failure, not a skip
    except Exception as exc:  # HelmLibraryError / OSError from loading libhelm_c
        pytest.skip(f"helm-python-sdk cannot load its native Helm library on this platform: {exc}")
    return helm_python


@pytest.fixture(scope="session")
def chart(helm: Any) -> Iterator[Any]:
    loaded = helm.Chart.load(CHART_DIR)
    yield loaded
    loaded.close()


@pytest.fixture(scope="session")
def releases(chart: Any) -> dict[str, Release]:
    return {name: render(chart, scenario_values(name)) for name in SCENARIOS}
