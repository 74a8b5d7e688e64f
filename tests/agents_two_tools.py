"""A two-tool agent of the OpenAI Agents SDK against a kvmesh router over the Responses API (run by
tests/test_responses_agents.py in the SDK's own virtualenv: ``python agents_two_tools.py <base_url> <key>``).

Runs it twice, sending the whole conversation each turn, then chaining turns by ``previous_response_id``; prints
one JSON line per run: its final output, the tools it called, the kinds of items it made, its last response's id."""

import asyncio
import json
import sys

from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI
from pydantic import BaseModel

called: list[str] = []


class Verdict(BaseModel):
    """The agent's final answer: JSON (its schema goes as text.format, so a tiny model's answer ends)."""

    sunny: bool


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    called.append("get_weather")
    return "sunny"


@function_tool
def get_time(zone: str) -> str:
    """The time in a time zone."""
    called.append("get_time")
    return "noon"


async def main(base_url: str, key: str) -> None:
    set_tracing_disabled(True)
    model = OpenAIResponsesModel(model="stories", openai_client=AsyncOpenAI(base_url=base_url, api_key=key))
    agent = Agent(name="helper", instructions="Answer in a few words.", tools=[get_weather, get_time], model=model,
                  output_type=Verdict, model_settings=ModelSettings(tool_choice="required", parallel_tool_calls=False,
                                                                    max_tokens=96, temperature=0))
    for chained in (False, True):  # the whole conversation sent each turn; then each turn by previous_response_id
        called.clear()
        result = await Runner.run(agent, "What is the weather in paris, and the time?", max_turns=6,
                                  auto_previous_response_id=chained)
        print(json.dumps({"chained": chained, "final_output": result.final_output.model_dump(), "called": called,
                          "items": [item.type for item in result.new_items],
                          "previous_response_id": result.last_response_id}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
