"""The Responses API's streaming events for a finished response, in the real wire order: what
the offline demo model streams (gateway/agents/demo/assistant.py), and what the tests' fake
OpenAI server sends, so the SDK's real provider path parses exactly the same sequence."""

from __future__ import annotations

import copy
import itertools
import re
from collections.abc import Iterator
from typing import Any, TypedDict

from agents.items import TResponseStreamEvent
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseContentPartAddedEvent,
    ResponseContentPartDoneEvent,
    ResponseCreatedEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionCallArgumentsDoneEvent,
    ResponseFunctionToolCall,
    ResponseInProgressEvent,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseTextDeltaEvent,
    ResponseTextDoneEvent,
)
from openai.types.responses.response_reasoning_item import ResponseReasoningItem
from openai.types.responses.response_reasoning_summary_part_added_event import (
    Part as AddedPart,
)
from openai.types.responses.response_reasoning_summary_part_added_event import (
    ResponseReasoningSummaryPartAddedEvent,
)
from openai.types.responses.response_reasoning_summary_part_done_event import Part as DonePart
from openai.types.responses.response_reasoning_summary_part_done_event import (
    ResponseReasoningSummaryPartDoneEvent,
)
from openai.types.responses.response_reasoning_summary_text_delta_event import (
    ResponseReasoningSummaryTextDeltaEvent,
)
from openai.types.responses.response_reasoning_summary_text_done_event import (
    ResponseReasoningSummaryTextDoneEvent,
)


def split_deltas(text: str) -> list[str]:
    """Word-sized chunks with their trailing whitespace; they concatenate back to `text`."""
    return [chunk for chunk in re.split(r"(?<=\s)(?=\S)", text) if chunk]


def response_events(
    response: Response, *, argument_deltas: int = 1
) -> Iterator[TResponseStreamEvent]:
    """The Responses-API event sequence for a finished response, in the real wire order.
    `argument_deltas`: how many pieces a function call's arguments stream in."""
    seq = itertools.count()
    in_progress = response.model_copy(update={"output": [], "status": "in_progress", "usage": None})
    yield ResponseCreatedEvent(
        type="response.created", response=copy.deepcopy(in_progress), sequence_number=next(seq)
    )
    yield ResponseInProgressEvent(
        type="response.in_progress", response=copy.deepcopy(in_progress), sequence_number=next(seq)
    )
    for index, item in enumerate(response.output):
        if isinstance(item, ResponseOutputMessage):
            yield from _message_events(item, index, seq)
        elif isinstance(item, ResponseFunctionToolCall):
            yield from _function_call_events(item, index, seq, argument_deltas)
        elif isinstance(item, ResponseReasoningItem):
            yield from _reasoning_events(item, index, seq)
    yield ResponseCompletedEvent(
        type="response.completed", response=response, sequence_number=next(seq)
    )


class _SummaryPlace(TypedDict):
    """Where a reasoning summary's events belong: the fields they all carry."""

    item_id: str
    output_index: int
    summary_index: int


def _reasoning_events(
    item: ResponseReasoningItem, index: int, seq: Iterator[int]
) -> Iterator[TResponseStreamEvent]:
    yield ResponseOutputItemAddedEvent(
        type="response.output_item.added",
        item=item.model_copy(update={"summary": []}),
        output_index=index,
        sequence_number=next(seq),
    )
    for summary_index, part in enumerate(item.summary):
        where: _SummaryPlace = {
            "item_id": item.id,
            "output_index": index,
            "summary_index": summary_index,
        }
        yield ResponseReasoningSummaryPartAddedEvent(
            type="response.reasoning_summary_part.added",
            part=AddedPart(type="summary_text", text=""),
            sequence_number=next(seq),
            **where,
        )
        for delta in split_deltas(part.text):
            yield ResponseReasoningSummaryTextDeltaEvent(
                type="response.reasoning_summary_text.delta",
                delta=delta,
                sequence_number=next(seq),
                **where,
            )
        yield ResponseReasoningSummaryTextDoneEvent(
            type="response.reasoning_summary_text.done",
            text=part.text,
            sequence_number=next(seq),
            **where,
        )
        yield ResponseReasoningSummaryPartDoneEvent(
            type="response.reasoning_summary_part.done",
            part=DonePart(type="summary_text", text=part.text),
            sequence_number=next(seq),
            **where,
        )
    yield ResponseOutputItemDoneEvent(
        type="response.output_item.done", item=item, output_index=index, sequence_number=next(seq)
    )


def _message_events(
    item: ResponseOutputMessage, index: int, seq: Iterator[int]
) -> Iterator[TResponseStreamEvent]:
    started = item.model_copy(update={"content": [], "status": "in_progress"})
    yield ResponseOutputItemAddedEvent(
        type="response.output_item.added",
        item=started,
        output_index=index,
        sequence_number=next(seq),
    )
    for part_index, part in enumerate(item.content):
        if not isinstance(part, ResponseOutputText):
            continue
        common: dict[str, Any] = {
            "item_id": item.id,
            "output_index": index,
            "content_index": part_index,
        }
        yield ResponseContentPartAddedEvent(
            type="response.content_part.added",
            part=ResponseOutputText(type="output_text", text="", annotations=[], logprobs=[]),
            sequence_number=next(seq),
            **common,
        )
        for delta in split_deltas(part.text):
            yield ResponseTextDeltaEvent(
                type="response.output_text.delta",
                delta=delta,
                logprobs=[],
                sequence_number=next(seq),
                **common,
            )
        yield ResponseTextDoneEvent(
            type="response.output_text.done",
            text=part.text,
            logprobs=[],
            sequence_number=next(seq),
            **common,
        )
        yield ResponseContentPartDoneEvent(
            type="response.content_part.done",
            part=copy.deepcopy(part),
            sequence_number=next(seq),
            **common,
        )
    yield ResponseOutputItemDoneEvent(
        type="response.output_item.done",
        item=copy.deepcopy(item),
        output_index=index,
        sequence_number=next(seq),
    )


def _function_call_events(
    item: ResponseFunctionToolCall, index: int, seq: Iterator[int], pieces: int
) -> Iterator[TResponseStreamEvent]:
    item_id = item.id or item.call_id
    started = item.model_copy(update={"arguments": "", "status": "in_progress"})
    yield ResponseOutputItemAddedEvent(
        type="response.output_item.added",
        item=started,
        output_index=index,
        sequence_number=next(seq),
    )
    arguments = item.arguments
    size = -(-len(arguments) // max(1, pieces)) or 1
    for start in range(0, max(1, len(arguments)), size):
        yield ResponseFunctionCallArgumentsDeltaEvent(
            type="response.function_call_arguments.delta",
            item_id=item_id,
            output_index=index,
            delta=arguments[start : start + size],
            sequence_number=next(seq),
        )
    # Older openai releases require `name` on this event; newer ones keep it as an extra.
    yield ResponseFunctionCallArgumentsDoneEvent.model_validate(
        {
            "type": "response.function_call_arguments.done",
            "item_id": item_id,
            "output_index": index,
            "arguments": item.arguments,
            "name": item.name,
            "sequence_number": next(seq),
        }
    )
    yield ResponseOutputItemDoneEvent(
        type="response.output_item.done",
        item=copy.deepcopy(item),
        output_index=index,
        sequence_number=next(seq),
    )
