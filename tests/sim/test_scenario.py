"""The scenario loader: strict, and every error is one line naming the file and the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from fleetloop.sim.scenario import ScenarioError, load_scenario
from tests.sim.conftest import small_scenario_dict

SHIPPED = sorted(Path(__file__).resolve().parents[2].joinpath("scenarios").glob("*.yaml"))


def _write(tmp_path: Path, data: Any) -> Path:
    p = tmp_path / "x.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def _error(tmp_path: Path, data: Any) -> str:
    with pytest.raises(ScenarioError) as info:
        load_scenario(_write(tmp_path, data))
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith(str(tmp_path / "x.yaml") + ": ")
    return msg


def test_unknown_gpu_names_field_and_known_values(tmp_path: Path) -> None:
    d = small_scenario_dict()
    d["pools"][0]["gpu"] = "H900"
    msg = _error(tmp_path, d)
    assert msg.endswith("pools[0].gpu: unknown GPU 'H900' (known: A100, H100, H200, L40S, MI300X)")


def test_a_model_that_does_not_fit_its_gpus_is_refused(tmp_path: Path) -> None:
    d = small_scenario_dict()
    d["pools"][0].update(model="llama-405b", gpu="H100")  # 812 GB of BF16 weights on 8 x 80 GB
    msg = _error(tmp_path, d)
    assert "pools[0]" in msg
    assert "llama-405b in bf16 does not fit 8 x H100" in msg
    d["pools"][0]["precision"] = "fp8"
    load_scenario(_write(tmp_path, d))  # FP8 fits


def test_unknown_field_is_refused(tmp_path: Path) -> None:
    d = small_scenario_dict()
    d["workload"][1]["client"]["timeout"] = 3
    assert _error(tmp_path, d).endswith("workload[1].client.timeout: unknown field")


def test_unknown_tenant_reference(tmp_path: Path) -> None:
    d = small_scenario_dict()
    d["workload"][0]["tenant"] = "platinum"
    assert "workload[0].tenant: unknown tenant 'platinum'" in _error(tmp_path, d)


def test_bad_fault_target_and_shape(tmp_path: Path) -> None:
    d = small_scenario_dict()
    d["faults"][0]["node"] = "small/9"
    assert "faults[0].node" in _error(tmp_path, d)
    d = small_scenario_dict()
    del d["faults"][3]["factor"]
    assert "faults[3]" in _error(tmp_path, d)
    assert "factor" in _error(tmp_path, d)


def test_node_bounds_and_token_order(tmp_path: Path) -> None:
    d = small_scenario_dict()
    d["pools"][1]["nodes"] = 9
    assert "pools[1]" in _error(tmp_path, d)
    d = small_scenario_dict()
    d["workload"][0]["prompt_tokens"] = {"median": 9000, "max": 100}
    assert "workload[0].prompt_tokens" in _error(tmp_path, d)


@pytest.mark.parametrize(
    ("where", "value", "said"),
    [
        (("pools", 0, "nodes"), True, "pools[0].nodes: a whole number, not true/false"),
        (("workload", 0, "client", "max_retries"), False, "max_retries: a whole number, not true/false"),
        (("duration_s",), float("nan"), "duration_s: Input should be a finite number"),
        (("workload", 0, "rate_per_s"), float("inf"), "rate_per_s: Input should be a finite number"),
        (("faults", 0, "at_s"), 1e9, "faults[0].at_s: 1e+09 s is after the last task's deadline"),
        (("pools", 0, "gpus_per_node"), 3, "pools[0].gpus_per_node: 3 GPUs cannot split"),
    ],
)
def test_values_the_types_accept_but_no_fleet_has_are_refused(
    tmp_path: Path, where: tuple[Any, ...], value: Any, said: str
) -> None:
    """YAML's true read as 1 node, NaN failing a bound with a message about the bound, a fault after the
    end that never fires, three-way tensor parallelism: each is one line naming the field."""
    d = small_scenario_dict()
    target = d
    for key in where[:-1]:
        target = target[key]
    target[where[-1]] = value
    assert said in _error(tmp_path, d)


def test_not_yaml_and_missing_file(tmp_path: Path) -> None:
    p = tmp_path / "x.yaml"
    p.write_text("pools: [unclosed\n")
    with pytest.raises(ScenarioError, match=r"x.yaml: not valid YAML at line \d+"):
        load_scenario(p)
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path / "nope.yaml")


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_every_shipped_scenario_loads(path: Path) -> None:
    sc = load_scenario(path)
    assert sc.name == path.stem


def test_required_scenarios_are_shipped() -> None:
    names = [p.stem for p in SHIPPED]
    assert len(names) >= 8
    assert any("prefix" in n for n in names)
    assert any("cascade" in n for n in names)
