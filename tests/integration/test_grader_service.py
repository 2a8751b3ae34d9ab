"""The grader service over real HTTP: grading, back-pressure, metrics, graceful shutdown."""

from __future__ import annotations

import asyncio
import contextlib

import httpx
import pytest
from aiohttp import web

from gagar.grader.protocol import HeuristicGrader
from gagar.grader.sample import sample_group
from gagar.grader.service import GraderClient, GraderService, GraderUnavailable, ServiceConfig
from gagar.wire import GradingGroup, Ranking
from tests.support.exposition import missing, value


class GatedGrader:
    """Blocks each grade until released (or forever), counting calls."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.started = 0

    async def grade(self, group: GradingGroup) -> Ranking:
        self.started += 1
        await self.gate.wait()
        return Ranking(grader="heuristic", tied_groups=[{"tier": "T1", "members": group.passes()}])


class FallbackGrader:
    async def grade(self, group: GradingGroup) -> Ranking:
        return Ranking(
            grader="none", fallback="timeout", detail="deadline", usage={"prompt_tokens": 7}
        )


class BrokenGrader:
    async def grade(self, group: GradingGroup) -> Ranking:
        raise RuntimeError("bug in grader")


@contextlib.asynccontextmanager
async def running(service: GraderService):
    runner = web.AppRunner(service.app(), shutdown_timeout=10)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", runner
    finally:
        if runner.server is not None:
            await runner.cleanup()


async def _wait_for(cond, timeout=5.0):
    for _ in range(int(timeout / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


def test_grades_a_group_and_exports_metrics():
    async def main():
        async with running(GraderService(HeuristicGrader())) as (url, _):
            ranking = await GraderClient(url).grade(sample_group())
            async with httpx.AsyncClient() as http:
                health = await http.get(f"{url}/healthz")
                bad = await http.post(f"{url}/v1/grade", json={"task_id": "t"})
                metrics = (await http.get(f"{url}/metrics")).text
        return ranking, health, metrics, bad

    ranking, health, metrics, bad = asyncio.run(main())
    assert ranking.grader == "heuristic" and [g.members for g in ranking.tied_groups] == [[0], [1]]
    assert [h.member for h in ranking.hacks] == [2]
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert bad.status_code == 400 and "candidates" in bad.json()["error"]
    requests = "gagar_grader_requests_total"
    assert value(metrics, requests, grader="heuristic", outcome="ok") == 1.0
    assert value(metrics, requests, grader="none", outcome="invalid") == 1.0
    assert value(metrics, "gagar_grader_confirmed_hacks_total") == 1.0
    assert value(metrics, "gagar_grader_request_duration_seconds_count", grader="heuristic") == 1
    assert value(metrics, "gagar_grader_queue_depth", pool="grader") == 0.0
    assert missing(metrics, "grader") == []


def test_back_pressure_when_the_queue_is_full():
    async def main():
        grader = GatedGrader()
        service = GraderService(grader, ServiceConfig(queue_size=1, workers=1))
        async with running(service) as (url, _):
            client = GraderClient(url, retries=0)
            first = asyncio.create_task(client.grade(sample_group()))
            await _wait_for(lambda: grader.started == 1)
            second = asyncio.create_task(client.grade(sample_group()))
            await _wait_for(lambda: service._queue.qsize() == 1)
            async with httpx.AsyncClient() as http:
                depth = (await http.get(f"{url}/metrics")).text
                third = await http.post(f"{url}/v1/grade", content=sample_group().model_dump_json())
                grader.gate.set()
                results = await asyncio.gather(first, second)
                metrics = (await http.get(f"{url}/metrics")).text
        return third, depth, results, metrics

    third, depth, results, metrics = asyncio.run(main())
    assert third.status_code == 429 and third.headers["Retry-After"] == "1"
    assert value(depth, "gagar_grader_queue_depth") == 1.0
    assert value(depth, "gagar_grader_in_flight") == 1.0
    assert all(r.tied_groups[0].members == [0, 1, 2] for r in results)
    assert value(metrics, "gagar_grader_requests_total", grader="none", outcome="rejected") == 1
    assert value(metrics, "gagar_grader_requests_total", grader="heuristic", outcome="ok") == 2


def test_client_retries_after_429():
    async def main():
        grader = GatedGrader()
        service = GraderService(grader, ServiceConfig(queue_size=1, workers=1))
        async with running(service) as (url, _):
            first = asyncio.create_task(GraderClient(url, retries=0).grade(sample_group()))
            await _wait_for(lambda: grader.started == 1)
            second = asyncio.create_task(GraderClient(url, retries=0).grade(sample_group()))
            await _wait_for(lambda: service._queue.qsize() == 1)
            patient = asyncio.create_task(
                GraderClient(url, retries=5, backoff=0.05).grade(sample_group())
            )
            await asyncio.sleep(0.3)
            grader.gate.set()
            return await asyncio.gather(first, second, patient)

    assert len(asyncio.run(main())) == 3


def test_graceful_shutdown_finishes_in_flight_work():
    async def main():
        grader = GatedGrader()
        service = GraderService(grader, ServiceConfig(queue_size=4, workers=1, drain_seconds=5))
        async with running(service) as (url, runner):
            tasks = [
                asyncio.create_task(GraderClient(url, retries=0).grade(sample_group()))
                for _ in range(3)
            ]
            await _wait_for(lambda: grader.started == 1 and service._queue.qsize() == 2)
            stopping = asyncio.create_task(runner.cleanup())
            await _wait_for(lambda: service.draining)
            asyncio.get_running_loop().call_later(0.2, grader.gate.set)
            results = await asyncio.gather(*tasks)
            await stopping
            with pytest.raises(GraderUnavailable):
                await GraderClient(url, retries=0).grade(sample_group())
        return results

    results = asyncio.run(main())
    assert len(results) == 3 and all(r.grader == "heuristic" for r in results)


def test_shutdown_returns_unfinished_work_as_503():
    async def main():
        grader = GatedGrader()  # never released
        service = GraderService(grader, ServiceConfig(queue_size=4, workers=1, drain_seconds=0.3))
        async with running(service) as (url, runner):
            async with httpx.AsyncClient(timeout=10) as http:
                body = sample_group().model_dump_json()
                posts = [
                    asyncio.create_task(http.post(f"{url}/v1/grade", content=body))
                    for _ in range(2)
                ]
                await _wait_for(lambda: grader.started == 1 and service._queue.qsize() == 1)
                await runner.cleanup()
                return await asyncio.gather(*posts)

    responses = asyncio.run(main())
    assert [r.status_code for r in responses] == [503, 503]
    assert all("shutting down" in r.json()["error"] for r in responses)


def test_grader_bug_is_a_500_and_the_worker_survives():
    async def main():
        service = GraderService(BrokenGrader(), ServiceConfig(workers=1))
        async with running(service) as (url, _):
            async with httpx.AsyncClient() as http:
                body = sample_group().model_dump_json()
                a = await http.post(f"{url}/v1/grade", content=body)
                b = await http.post(f"{url}/v1/grade", content=body)
        return a, b

    a, b = asyncio.run(main())
    assert a.status_code == b.status_code == 500 and "bug in grader" in b.json()["error"]


def test_client_gives_up_on_dead_service():
    with pytest.raises(GraderUnavailable, match="2 attempts"):
        GraderClient("http://127.0.0.1:9", retries=1, backoff=0.01).grade_sync(sample_group())


def test_fallbacks_and_tokens_are_counted():
    async def main():
        async with running(GraderService(FallbackGrader())) as (url, _):
            ranking = await GraderClient(url).grade(sample_group())
            async with httpx.AsyncClient() as http:
                return ranking, (await http.get(f"{url}/metrics")).text

    ranking, metrics = asyncio.run(main())
    assert ranking.fallback == "timeout" and ranking.grader == "none"
    assert value(metrics, "gagar_grader_requests_total", grader="none", outcome="fallback") == 1
    assert value(metrics, "gagar_grader_ranking_fallbacks_total", reason="timeout") == 1.0
    assert value(metrics, "gagar_grader_timeouts_total") == 1.0
    assert value(metrics, "gagar_grader_tokens_total", kind="prompt") == 7.0
