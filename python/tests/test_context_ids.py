"""The id rule (docs/design.md, sections 2 and 9): one rule for a Context's id
and the request it travels with, 1 to 256 bytes of printable UTF-8, owned by
Go (ctxtree.ValidateID) and applied when the Context is created; an id it
accepts is accepted by generate and reaches the handler unchanged."""

from __future__ import annotations

import asyncio

import pytest

from dynamo_ctx import Context, DistributedRuntime
from dynamo_ctx._lib import native
from harness import HANG, new_namespace
from helpers import run

RULE = "1 to 256 bytes of printable UTF-8"

GOOD = {
    "one-byte": "a",
    "ascii": "req-42",
    "space": "with space",
    "punctuation": "~!@#$%^&*()_+{}|:<>?[];',./`\"\\",
    "non-ascii": "réq-ñ-日本語-🙂",
    "256-ascii": "x" * 256,
    "256-2byte": "é" * 128,
    "256-4byte": "🙂" * 64,
    "255-then-1": "x" * 255 + "y",
}

BAD = {
    "empty": "",
    "257-ascii": "x" * 257,
    "258-2byte": "é" * 129,
    "257-mixed": "x" * 255 + "é",  # 255 characters, 257 bytes
    "tab": "a\tb",
    "newline": "a\nb",
    "nul": "a\x00b",
    "del": "\x7f",
    "c1-control": "a\x85b",
    "no-break-space": "a\xa0b",
    "zero-width-space": "a\u200bb",
    "line-separator": "a\u2028b",
    "lone-surrogate": "\ud800",
    "low-surrogate-pair": "a\udc80",
}


def test_the_rule_is_the_librarys():
    assert native().MAX_ID_LEN == 256


@pytest.mark.parametrize("good", list(GOOD.values()), ids=list(GOOD))
def test_accepted_ids(good):
    ctx = Context(good)
    assert ctx.id() == good
    assert ctx.child().id() == good  # its Go side takes it too
    assert Context(id=good).id() == good


@pytest.mark.parametrize("bad", list(BAD.values()), ids=list(BAD))
def test_refused_ids_state_the_rule(bad):
    with pytest.raises(ValueError, match=RULE):
        Context(bad)
    with pytest.raises(ValueError, match=RULE):
        Context(id=bad, metadata={"k": 1})


def test_uuid_ids_follow_the_rule():
    ctx = Context()
    assert Context(ctx.id()).id() == ctx.id()


def test_accepted_ids_are_accepted_by_generate(nats_url):
    """Every id Context accepts goes through generate, to the handler's
    context, unchanged (the request plane applies the same rule)."""
    seen = []

    async def handler(request, context):
        seen.append(context.id())
        yield context.id()

    async def main():
        rt = DistributedRuntime(nats_url=nats_url)
        try:
            endpoint = rt.endpoint(f"{new_namespace('ids')}.backend.generate")
            serving = asyncio.ensure_future(endpoint.serve_endpoint(handler))
            await endpoint.serving()
            client = await endpoint.client()
            await client.wait_for_instances()
            for good in GOOD.values():
                stream = await client.generate({}, annotated=False, context=Context(good))
                assert [item async for item in stream] == [good]
        finally:
            rt.shutdown()
        await asyncio.wait_for(serving, HANG)

    run(main())
    assert seen == list(GOOD.values())
