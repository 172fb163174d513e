"""The continuous-batching engine: the scheduler plans a step, the runner computes it, the sampler draws, and the
engine writes the results back; speculation proposes and verifies drafts; async_engine runs it under asyncio."""
from decodelab.engine.async_engine import AsyncEngine
from decodelab.engine.engine import Engine, EngineStats, StepOutput, TokenEvent

__all__ = ["AsyncEngine", "Engine", "EngineStats", "StepOutput", "TokenEvent"]
