"""The continuous-batching engine: the scheduler plans a step, the speculator proposes (or not), the runner computes
it, the step draws its tokens, the scheduler writes them back in one place, and the outputs are read off the result;
async_engine runs it under asyncio."""
from decodelab.engine.async_engine import AsyncEngine
from decodelab.engine.config import EngineConfig
from decodelab.engine.engine import CheckedRequest, Engine, EngineStats, StepKind, StepOutput, TokenEvent

__all__ = ["AsyncEngine", "CheckedRequest", "Engine", "EngineConfig", "EngineStats", "StepKind", "StepOutput",
           "TokenEvent"]
