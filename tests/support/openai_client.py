"""The client side of tests/openai_sdk.rs: the official `openai` Python SDK
calling tollgate, with calls the test describes and a JSON report of what
the SDK made of each answer.

The plan is one JSON argument:
    {"base_url": ..., "api_key": ...,
     "calls": [{"name": ..., "max_retries": N, "headers": {...},
                "request": {...keyword arguments of chat.completions.create...}}]}
Printed, one JSON document: a list with, for each call in order, its name,
the seconds it took (the SDK's own retries and their waits included) and
either what the SDK returned or the exception it raised:
    "completion": the ChatCompletion as the SDK parsed it (the fields the
        answer set), "typed": the fields read through the SDK's attributes;
    "chunks": each ChatCompletionChunk the stream yielded, likewise;
    "error": the exception's class, status code, message and parsed body.
Calls run in order, each on a client of its own, so a later call sees the limits an
earlier one spent.
"""

import json
import sys
import time

import openai


def completion_report(completion):
    choice = completion.choices[0]
    return {
        "completion": completion.model_dump(mode="json", exclude_unset=True),
        "typed": {
            "id": completion.id,
            "object": completion.object,
            "model": completion.model,
            "created": completion.created,
            "content": choice.message.content,
            "role": choice.message.role,
            "finish_reason": choice.finish_reason,
            "usage": completion.usage.model_dump(mode="json", exclude_unset=True),
        },
    }


def stream_report(stream):
    chunks, content, usage, finish_reason = [], "", None, None
    for chunk in stream:
        chunks.append(chunk.model_dump(mode="json", exclude_unset=True))
        for choice in chunk.choices:
            content += choice.delta.content or ""
            finish_reason = choice.finish_reason or finish_reason
        if chunk.usage is not None:
            usage = chunk.usage.model_dump(mode="json", exclude_unset=True)
    return {
        "chunks": chunks,
        "typed": {
            "content": content,
            "finish_reason": finish_reason,
            "usage": usage,
            # The chunks without a choice: the usage chunk.
            "without_choices": sum(1 for c in chunks if c.get("choices") == []),
        },
    }


def error_report(error):
    return {
        "error": {
            "class": type(error).__name__,
            "status_code": getattr(error, "status_code", None),
            "message": str(error),
            "body": getattr(error, "body", None),
        }
    }


def client_for(plan, call):
    return openai.OpenAI(
        base_url=plan["base_url"],
        api_key=plan["api_key"],
        timeout=20.0,
        max_retries=call.get("max_retries", 0),
        # Every answer is validated against the SDK's types: a field they
        # require and an answer lacks is an error here, where the default,
        # lenient parsing would read it as None. (A client of its own for
        # each call: `with_options` does not carry this private option.)
        _strict_response_validation=True,
    )


def run(client, call):
    request = dict(call["request"])
    started = time.monotonic()
    try:
        answer = client.chat.completions.create(
            extra_headers=call.get("headers", {}), **request
        )
        if request.get("stream"):
            report = stream_report(answer)
        else:
            report = completion_report(answer)
    except openai.APIError as error:
        report = error_report(error)
        if isinstance(error, openai.APIResponseValidationError):
            # What the SDK's types found missing or wrong.
            report["error"]["cause"] = str(error.__cause__)
    report["name"] = call["name"]
    report["seconds"] = time.monotonic() - started
    return report


def main():
    plan = json.loads(sys.argv[1])
    print(json.dumps([run(client_for(plan, call), call) for call in plan["calls"]]))


if __name__ == "__main__":
    main()
