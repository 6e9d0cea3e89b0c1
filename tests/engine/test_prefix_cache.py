"""The prefix cache's lane bookkeeping (engine/prefix_cache.py) over real `Lanes`, no device:
which warm lane a prompt gets, how far it may resume, and that no lane is lost or handed out twice."""

from __future__ import annotations

import pytest

from calculet.calbin.manifest import KVLayout
from calculet.engine.prefix_cache import MIN_HIT_TOKENS, PrefixCache
from calculet.runtime.lanes import Lanes


def make_lanes(count=3, context=256) -> Lanes:
    return Lanes(KVLayout("BNSH", "float32", 1, count, 1, context, 2, True, (context,)))


def finish(cache: PrefixCache, tokens, cached_ok=True) -> int:
    """Allocate a lane for `tokens`, pretend it was prefilled, release it warm; the lane."""
    return finish_together(cache, [tokens], cached_ok)[0]


def finish_together(cache: PrefixCache, prompts, cached_ok=True) -> list[int]:
    """Run several sequences at once (each holds its lane), then release them in order."""
    grants = [cache.allocate(tuple(tokens)) for tokens in prompts]
    for grant, tokens in zip(grants, prompts):
        cache.lanes.advance(grant.lane, len(tokens) - grant.cached)
    for grant, tokens in zip(grants, prompts):
        cache.release(grant.lane, tuple(tokens) if cached_ok else None)
    return [g.lane for g in grants]


PROMPT = tuple(range(1, 101))


def test_longest_common_prefix_wins_and_resumes_there():
    cache = PrefixCache(make_lanes())
    short, long = finish_together(cache, [PROMPT[:40], PROMPT[:80]])
    assert short != long
    grant = cache.allocate(PROMPT[:90] + (999,))
    assert (grant.lane, grant.cached) == (long, 80)
    assert cache.lanes.length(long) == 80 and cache.lanes.in_use(long)
    s = cache.stats()
    assert (s.lookups, s.hits, s.tokens_saved, s.warm) == (3, 1, 80, 1)
    # a prompt that extends a finished one resumes on its lane (a multi-turn chat's next turn)
    cache.release(grant.lane, None)
    assert cache.allocate(PROMPT[:40] + (1, 2)).lane == short


def test_at_least_one_token_is_prefilled():
    """An identical prompt resumes one token short of its end: the last token must run to give logits."""
    cache = PrefixCache(make_lanes())
    lane = finish(cache, PROMPT)
    grant = cache.allocate(PROMPT)
    assert (grant.lane, grant.cached) == (lane, len(PROMPT) - 1)


def test_divergence_inside_the_held_tokens_rewinds_the_lane():
    cache = PrefixCache(make_lanes())
    lane = finish(cache, PROMPT)
    grant = cache.allocate(PROMPT[:50] + (7, 7, 7))
    assert (grant.lane, grant.cached) == (lane, 50) and cache.lanes.length(lane) == 50


def test_rewind_limit_is_respected():
    """With max_rewind=R a lane holding L positions is resumed only at m >= L - R."""
    cache = PrefixCache(make_lanes(count=2), max_rewind=30)
    lane = finish(cache, PROMPT)                   # holds 100
    far = cache.allocate(PROMPT[:60] + (5,) * 10)  # m=60: 40 back > 30
    assert far.lane != lane and far.cached == 0
    near = cache.allocate(PROMPT[:75] + (5,))      # m=75: 25 back
    assert (near.lane, near.cached) == (lane, 75)


def test_a_lane_whose_ring_never_wrapped_resumes_at_any_prefix():
    """The bound is for wrapped rings: a lane that held 100 positions (reach 101) with 128-row rings
    resumes 40 back; with 100-row rings it has wrapped and does not."""
    for ring, resumed in ((128, True), (100, False)):
        cache = PrefixCache(make_lanes(count=2), max_rewind=30, ring=ring)
        lane = finish(cache, PROMPT)                   # holds 100
        assert cache.lanes.reach(lane) == 101
        grant = cache.allocate(PROMPT[:60] + (5,) * 10)
        assert (grant.lane == lane and grant.cached == 60) if resumed else grant.cached == 0


def test_short_match_keeps_the_warm_lane_while_a_cold_one_is_free():
    cache = PrefixCache(make_lanes(count=2))
    lane = finish(cache, PROMPT)
    grant = cache.allocate(PROMPT[:MIN_HIT_TOKENS - 1] + (5,) * 20)
    assert grant.lane != lane and grant.cached == 0 and cache.stats().warm == 1
    # no cold lane left: the short match is taken rather than nothing
    again = cache.allocate(PROMPT[:MIN_HIT_TOKENS - 1] + (5,) * 20)
    assert (again.lane, again.cached) == (lane, MIN_HIT_TOKENS - 1)


def test_least_recently_used_warm_lane_is_evicted_on_a_miss():
    cache = PrefixCache(make_lanes(count=2))
    old = finish(cache, PROMPT[:40])
    new = finish(cache, (500,) + PROMPT[:40])      # no match: the cold lane
    assert old != new
    grant = cache.allocate((900,) * 30)            # no match, no cold lane
    assert (grant.lane, grant.cached) == (old, 0) and cache.lanes.length(old) == 0
    assert cache.stats().warm == 1


def test_a_warm_lane_is_handed_out_once():
    cache = PrefixCache(make_lanes(count=3))
    lane = finish(cache, PROMPT)
    grants = [cache.allocate(PROMPT + (i,)) for i in range(3)]
    assert [g.lane for g in grants].count(lane) == 1
    assert len({g.lane for g in grants}) == 3 and not cache.can_allocate()
    assert sum(g.cached > 0 for g in grants) == 1


def test_invalid_kv_is_not_kept():
    """A cancelled or failed sequence (tokens=None), or one whose lane length disagrees, frees cold."""
    cache = PrefixCache(make_lanes())
    finish(cache, PROMPT, cached_ok=False)
    grant = cache.allocate(PROMPT)
    cache.lanes.advance(grant.lane, 10)            # holds 10 positions, claims 100
    cache.release(grant.lane, PROMPT)
    assert cache.stats().warm == 0 and cache.lanes.free_count() == 3


def test_reset_and_fence_drop_warm_lanes():
    cache = PrefixCache(make_lanes())
    finish(cache, PROMPT)
    cache.lanes.reset_all()
    assert cache.allocate(PROMPT).cached == 0
    cache = PrefixCache(make_lanes())
    finish(cache, PROMPT)
    cache.lanes.renew_buffers()                    # a fence: zeroed buffers, lengths untouched
    assert cache.allocate(PROMPT).cached == 0


def test_disabled_cache_only_allocates_and_frees():
    cache = PrefixCache(make_lanes(), enabled=False)
    finish(cache, PROMPT)
    grant = cache.allocate(PROMPT)
    assert grant.cached == 0 and grant.lane == 0
    assert cache.stats() == type(cache.stats())(0, 0, 0, 0)


def test_bad_max_rewind_is_refused():
    with pytest.raises(ValueError, match="max_rewind"):
        PrefixCache(make_lanes(), max_rewind=-1)
