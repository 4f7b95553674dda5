"""Drives keypool with the official OpenAI Python SDK (run by tests/tests/openai.rs).

Environment: KEYPOOL_BASE_URL (the org-scoped pool URL plus /v1, e.g.
http://127.0.0.1:PORT/acme/team/v1), KEYPOOL_KEY (a valid sk-lb- key), KEYPOOL_BAD_KEY
(an unknown one), KEYPOOL_MODEL.
Prints one JSON object with what the SDK got back; the Rust side asserts on it.
SDK retries are off (max_retries=0) so that a retry can never hide a failure.
"""

import json
import os
import sys

import openai

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def completion(client, model, messages):
    raw = client.chat.completions.with_raw_response.create(
        model=model, max_tokens=64, messages=messages
    )
    done = raw.parse()
    choice = done.choices[0]
    return {
        "status": raw.status_code,
        "request_id": raw.headers.get("x-request-id"),
        "content_type": raw.headers.get("content-type"),
        "id": done.id,
        "object": done.object,
        "role": choice.message.role,
        "text": choice.message.content,
        "finish_reason": choice.finish_reason,
        "prompt_tokens": done.usage.prompt_tokens,
        "completion_tokens": done.usage.completion_tokens,
        "total_tokens": done.usage.total_tokens,
    }


def stream(client, model, messages):
    pieces, usage, finish, ids = [], None, None, set()
    chunks = client.chat.completions.create(
        model=model,
        max_tokens=64,
        messages=messages,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in chunks:
        ids.add(chunk.id)
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                pieces.append(choice.delta.content)
            if choice.finish_reason:
                finish = choice.finish_reason
    return {
        "pieces": pieces,
        "ids": len(ids),
        "finish_reason": finish,
        "prompt_tokens": usage.prompt_tokens if usage else None,
        "completion_tokens": usage.completion_tokens if usage else None,
    }


def tool_round_trip(client, model):
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.chat.completions.create(
        model=model, max_tokens=64, messages=messages, tools=[WEATHER]
    )
    choice = first.choices[0]
    call = choice.message.tool_calls[0]
    arguments = json.loads(call.function.arguments)
    messages.append(choice.message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 C"})
    second = client.chat.completions.create(
        model=model, max_tokens=64, messages=messages, tools=[WEATHER]
    )
    # The same call streamed: the arguments arrive in fragments.
    streamed_name, streamed_args, streamed_finish = None, "", None
    for chunk in client.chat.completions.create(
        model=model, max_tokens=64, messages=messages[:1], tools=[WEATHER], stream=True
    ):
        for c in chunk.choices:
            for tc in c.delta.tool_calls or []:
                if tc.function and tc.function.name:
                    streamed_name = tc.function.name
                if tc.function and tc.function.arguments:
                    streamed_args += tc.function.arguments
            if c.finish_reason:
                streamed_finish = c.finish_reason
    return {
        "finish_reason": choice.finish_reason,
        "name": call.function.name,
        "call_id": call.id,
        "arguments": arguments,
        "answer": second.choices[0].message.content,
        "answer_finish_reason": second.choices[0].finish_reason,
        "streamed_name": streamed_name,
        "streamed_arguments": json.loads(streamed_args) if streamed_args else None,
        "streamed_finish_reason": streamed_finish,
    }


def main() -> None:
    base_url = os.environ["KEYPOOL_BASE_URL"]
    model = os.environ["KEYPOOL_MODEL"]
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello"},
    ]
    client = openai.OpenAI(
        base_url=base_url, api_key=os.environ["KEYPOOL_KEY"], max_retries=0, timeout=30.0
    )
    out = {"sdk_version": openai.__version__}
    out["create"] = completion(client, model, messages)
    out["stream"] = stream(client, model, messages)
    out["tools"] = tool_round_trip(client, model)
    out["models"] = [m.id for m in client.models.list()]

    bad = openai.OpenAI(
        base_url=base_url, api_key=os.environ["KEYPOOL_BAD_KEY"], max_retries=0, timeout=30.0
    )
    try:
        bad.chat.completions.create(model=model, messages=messages)
        out["unauthorized"] = {"raised": None}
    except openai.APIStatusError as e:
        out["unauthorized"] = {
            "raised": type(e).__name__,
            "is_authentication_error": isinstance(e, openai.AuthenticationError),
            "status": e.status_code,
            "body": e.body,
            "request_id": e.response.headers.get("x-request-id"),
        }

    json.dump(out, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
