"""ec_transfer_params: both halves (metadata + address) or neither."""

from __future__ import annotations

import re

import pytest

from ec_connector.domain.errors import ProtocolError
from ec_connector.domain.protocol import MAX_KEY_CHARS
from ec_connector.domain.publish import PeerAddress, PeerRef, parse_transfer_params, publish

ADDR = PeerAddress("10.0.0.7", 5601)
GRID = {"image_grid_thw": [1, 28, 28]}


def _servable_item(**over):
    item = {"metadata": dict(GRID), "peer_host": "10.0.0.7", "peer_port": 5601, "size_bytes": 4096}
    item.update(over)
    return item


def test_servable_item_carries_metadata_and_full_address():
    out = publish({"h1": GRID}, {"h1": 4096}, ADDR)
    assert out == {"h1": {"metadata": GRID, "peer_host": "10.0.0.7", "peer_port": 5601, "size_bytes": 4096}}


def test_unservable_item_is_exactly_empty_metadata():
    out = publish({"h1": GRID}, {}, ADDR)
    assert out == {"h1": {"metadata": {}}}


def test_publish_reports_every_item_each_in_its_own_form():
    out = publish({"h1": GRID, "h2": {"image_grid_thw": [1, 4, 4]}}, {"h2": 512, "other": 9}, ADDR)
    assert set(out) == {"h1", "h2"}
    assert out["h1"] == {"metadata": {}}
    assert set(out["h2"]) == {"metadata", "peer_host", "peer_port", "size_bytes"}
    assert out["h2"]["size_bytes"] == 512


def test_published_metadata_is_a_copy():
    meta = {"image_grid_thw": [1, 2, 2]}
    out = publish({"h1": meta}, {"h1": 8}, ADDR)
    assert out["h1"]["metadata"] == meta
    assert out["h1"]["metadata"] is not meta


def test_published_params_parse_back_to_the_same_refs():
    out = publish({"h1": GRID, "h2": GRID}, {"h1": 4096}, ADDR)
    parsed = parse_transfer_params(out)
    assert parsed == {"h1": PeerRef("h1", ADDR, 4096, GRID), "h2": None}


@pytest.mark.parametrize(("host", "port"), [("", 5601), ("h", 0), ("h", 65536), ("h", -1)])
def test_peer_address_must_be_host_and_port(host, port):
    with pytest.raises(ValueError, match=re.escape(f"peer address {host!r}:{port} is not host:port")):
        PeerAddress(host, port)


def test_parse_accepts_the_servable_form():
    got = parse_transfer_params({"h1": _servable_item()})
    assert got == {"h1": PeerRef("h1", PeerAddress("10.0.0.7", 5601), 4096, GRID)}


def test_parse_accepts_a_servable_item_with_no_placeholder_metadata():
    got = parse_transfer_params({"h1": _servable_item(metadata={})})
    assert got["h1"] is not None and got["h1"].metadata == {}


@pytest.mark.parametrize("item", [{"metadata": {}}, {}])
def test_parse_reads_the_unservable_form_as_encode_locally(item):
    assert parse_transfer_params({"h1": item}) == {"h1": None}


def test_parse_of_empty_params_is_empty():
    assert parse_transfer_params({}) == {}


@pytest.mark.parametrize("raw", [None, [], "h1", 3])
def test_parse_rejects_params_that_are_not_a_mapping(raw):
    with pytest.raises(ProtocolError, match=re.escape(f"must be a mapping of mm_hash to item, got {raw!r}")):
        parse_transfer_params(raw)


@pytest.mark.parametrize("key", ["", 7, "x" * (MAX_KEY_CHARS + 1)])
def test_parse_rejects_a_key_that_is_not_an_mm_hash(key):
    with pytest.raises(ProtocolError, match=re.escape(f"key {key!r} is not an mm_hash string")):
        parse_transfer_params({key: {"metadata": {}}})


def test_parse_accepts_a_key_of_the_maximum_length():
    key = "x" * MAX_KEY_CHARS
    assert parse_transfer_params({key: {}}) == {key: None}


@pytest.mark.parametrize("item", [None, [], "peer", 5])
def test_parse_rejects_an_item_that_is_not_a_mapping(item):
    with pytest.raises(
        ProtocolError, match=re.escape(f"ec_transfer_params['h1'] must be a mapping, got {item!r}")
    ):
        parse_transfer_params({"h1": item})


def test_parse_rejects_metadata_that_is_not_a_mapping():
    with pytest.raises(
        ProtocolError, match=re.escape("ec_transfer_params['h1']['metadata'] must be a mapping")
    ):
        parse_transfer_params({"h1": _servable_item(metadata=[1, 28, 28])})


def test_parse_rejects_metadata_without_an_address():
    with pytest.raises(
        ProtocolError,
        match=re.escape(
            "ec_transfer_params['h1'] has metadata but no peer_host/peer_port/size_bytes: "
            "both halves or neither"
        ),
    ):
        parse_transfer_params({"h1": {"metadata": GRID}})


@pytest.mark.parametrize(
    ("drop", "missing"),
    [
        (("peer_host",), "peer_host"),
        (("peer_port",), "peer_port"),
        (("size_bytes",), "size_bytes"),
        (("peer_host", "size_bytes"), "peer_host, size_bytes"),
    ],
)
def test_parse_rejects_a_half_address_naming_what_is_missing(drop, missing):
    item = _servable_item()
    for key in drop:
        del item[key]
    with pytest.raises(ProtocolError, match=re.escape(f"ec_transfer_params['h1'] lacks {missing}")):
        parse_transfer_params({"h1": item})


def test_parse_rejects_an_address_with_empty_metadata_but_half_the_keys():
    with pytest.raises(
        ProtocolError, match=re.escape("ec_transfer_params['h1'] lacks peer_port, size_bytes")
    ):
        parse_transfer_params({"h1": {"metadata": {}, "peer_host": "h"}})


@pytest.mark.parametrize("host", ["", 5, None])
def test_parse_rejects_a_bad_peer_host(host):
    with pytest.raises(ProtocolError, match=re.escape(f"['peer_host'] = {host!r} is not a host")):
        parse_transfer_params({"h1": _servable_item(peer_host=host)})


@pytest.mark.parametrize("port", [0, 65536, -1, "5601", True, 5601.0, None])
def test_parse_rejects_a_bad_peer_port(port):
    with pytest.raises(
        ProtocolError, match=re.escape(f"ec_transfer_params['h1']['peer_port'] = {port!r} is not 1-65535")
    ):
        parse_transfer_params({"h1": _servable_item(peer_port=port)})


@pytest.mark.parametrize("size", [0, -5, "4096", True, 4096.0, None])
def test_parse_rejects_a_bad_size(size):
    with pytest.raises(
        ProtocolError, match=re.escape(f"ec_transfer_params['h1']['size_bytes'] = {size!r} is not > 0")
    ):
        parse_transfer_params({"h1": _servable_item(size_bytes=size)})


def test_parse_names_the_bad_item_among_good_ones():
    raw = {"good": _servable_item(), "bad-item": _servable_item(peer_port=0)}
    with pytest.raises(ProtocolError, match=re.escape("ec_transfer_params['bad-item']")):
        parse_transfer_params(raw)


def test_protocol_error_is_a_value_error():
    assert issubclass(ProtocolError, ValueError)


def test_a_servable_item_of_zero_bytes_is_refused_at_publish():
    with pytest.raises(ValueError, match="size_bytes > 0"):
        publish({"m": {"a": 1}}, {"m": 0}, PeerAddress("h", 1))
