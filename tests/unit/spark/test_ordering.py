"""``ordering`` other than ``none`` is refused by the Spark sink, ``format('servicebus')`` and the syphon job (issue 31,
step 1: order through failover is not kept across processes there yet): a one-line :class:`ConfigError` naming the
key, raised on the driver when the sink, the source's options or the syphon query are built - before any row is read
or any queue drained. ``none`` passes."""

from __future__ import annotations

import pytest

from spark_sb.core.errors import ConfigError
from spark_sb.spark.datasource import parse_options
from spark_sb.spark.sink import ServiceBusSink
from spark_sb.spark.syphon_job import SyphonBatchWriter, run_syphon, syphon_source
from tests.unit.sender.rig import make_config

PRIMARY = "Endpoint=sb://primary.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=p-secret"
SECONDARY = "Endpoint=sb://secondary.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=s-secret"


def _one_line(err: pytest.ExceptionInfo[ConfigError]) -> str:
    text = str(err.value)
    assert "\n" not in text
    assert [k for k, _ in err.value.errors] == ["ordering"]
    return text


class _NoSpark:
    """A session that fails the test if anything touches it (the refusal comes first)."""

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"spark.{name} touched before the ordering check")


@pytest.mark.parametrize("ordering", ["session", "entity"])
def test_the_spark_sink_refuses_ordering_when_it_is_built(ordering: str) -> None:
    with pytest.raises(ConfigError) as err:
        ServiceBusSink(make_config(ordering=ordering))
    text = _one_line(err)
    assert text.startswith(f"ordering: '{ordering}' is not supported by the Spark sink") and "none" in text


@pytest.mark.parametrize("ordering", ["session", "entity"])
def test_format_servicebus_refuses_the_ordering_option(ordering: str) -> None:
    options = {"primary.connection_string": PRIMARY, "secondary.connection_string": SECONDARY}
    with pytest.raises(ConfigError) as err:
        parse_options({**options, "entity": "orders", "ORDERING": ordering})
    text = _one_line(err)
    assert text.startswith("format('servicebus'): option 'ordering': ") and "valid here: none" in text
    assert parse_options({**options, "entity": "orders", "ordering": "none"}).config.ordering == "none"


@pytest.mark.parametrize("ordering", ["session", "entity"])
def test_the_syphon_job_refuses_ordering_before_its_query_starts(ordering: str) -> None:
    config = make_config(ordering=ordering)
    for build in (
        lambda: run_syphon(_NoSpark(), config, checkpoint="/nowhere"),  # type: ignore[arg-type]
        lambda: syphon_source(config),
        lambda: SyphonBatchWriter(config),
    ):
        with pytest.raises(ConfigError) as err:
            build()
        assert "the syphon job" in _one_line(err)


def test_ordering_none_is_accepted_everywhere() -> None:
    config = make_config(ordering="none")
    assert ServiceBusSink(config).config.ordering == "none"
    assert SyphonBatchWriter(config).config.ordering == "none"
