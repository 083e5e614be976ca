"""Ids: UUID strings, time first (so that an index takes the ids of one moment on one page)
with first characters that still change from one id to the next."""

from __future__ import annotations

import uuid

import pytest

from fairpool.ids import id_at, new_id

RANDOM = 0x0123_4567_89AB_CDEF_0123_4567  # 96 bits


@pytest.mark.parametrize("random", [0, RANDOM, (1 << 96) - 1])
def test_an_id_is_a_uuid_string_of_version_8(random: int) -> None:
    made = id_at(1_700_000_000_000_000, random)
    parsed = uuid.UUID(made)
    assert str(parsed) == made
    assert (parsed.version, parsed.variant) == (8, uuid.RFC_4122)


def test_the_first_8_characters_are_the_microsecond_which_wraps() -> None:
    assert id_at(0x1234_5678, RANDOM)[:8] == "12345678"
    assert id_at((7 << 32) + 0x1234_5678, RANDOM) == id_at(0x1234_5678, RANDOM)


@pytest.mark.parametrize(
    ("micros", "later"),
    [
        (1_700_000_000_000_000, 1_700_000_000_000_001),  # the next microsecond
        (0xFFFF_FFFE, 0xFFFF_FFFF),  # the last two before a wrap
    ],
)
def test_ids_of_later_microseconds_sort_after_and_differ_in_8_characters(
    micros: int, later: int
) -> None:
    # Random bits as far apart as they go: time alone orders them.
    first, second = id_at(micros, (1 << 96) - 1), id_at(later, 0)
    assert first < second
    assert first[:8] != second[:8]


def test_the_random_bits_apart_from_version_and_variant_are_kept() -> None:
    ids = {id_at(0, 1 << bit) for bit in range(96)}
    # 6 of the 96 bits are the version's and the variant's; the 90 others each change the id.
    assert len(ids) == 91


def test_new_ids_differ() -> None:
    made = [new_id() for _ in range(10_000)]
    assert len(set(made)) == len(made)
    assert all(uuid.UUID(i).version == 8 for i in made)


@pytest.mark.parametrize(("characters", "apart"), [(4, 65_536), (6, 256), (8, 1)])
def test_ids_made_far_enough_apart_differ_in_their_first_characters(
    characters: int, apart: int
) -> None:
    start = 1_700_000_000_123_456
    for offset in range(0, 10 * apart, max(1, apart // 7)):  # wherever in its window
        first, later = id_at(start + offset, RANDOM), id_at(start + offset + apart, RANDOM)
        assert first[:characters] != later[:characters]
