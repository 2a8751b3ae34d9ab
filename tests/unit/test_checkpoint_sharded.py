"""Loading a sharded (Megatron ``dist_checkpointing``) checkpoint runs no code stored in it.

torch's checkpoint reader unpickles ``.metadata`` freely and loads pickled objects with
``weights_only=False``; ``sharded.check_safe`` stands in front of it. A file that names any
callable is refused before torch sees it, and so is a checkpoint holding pickled objects.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    TensorProperties,
    TensorStorageMetadata,
)

from gagar.trainer import sharded
from gagar.trainer.checkpoint import CheckpointError


def _tensor_meta() -> TensorStorageMetadata:
    size = torch.Size([4, 2])
    chunk = ChunkStorageMetadata(offsets=torch.Size([0, 0]), sizes=size)
    return TensorStorageMetadata(TensorProperties(dtype=torch.bfloat16), size, [chunk])


def _checkpoint(tmp: Path, metadata: object, common: object = None) -> Path:
    (tmp / sharded.METADATA).write_bytes(pickle.dumps(metadata))
    torch.save(
        common if common is not None else {"optimizer": {"adam_step": 3.0}}, tmp / "common.pt"
    )
    return tmp


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, (f"touch {self.marker}",))


def test_torch_checkpoint_metadata_passes(tmp_path: Path) -> None:
    meta = Metadata(state_dict_metadata={"decoder.weight": _tensor_meta()})
    sharded.check_safe(_checkpoint(tmp_path, meta))


def test_metadata_that_names_a_callable_is_refused_unrun(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    meta = Metadata(state_dict_metadata={"decoder.weight": _tensor_meta()})
    meta.planner_data = _Payload(marker)  # torch's pickle.load would run it
    with pytest.raises(CheckpointError, match=r"posix\.system is not checkpoint metadata"):
        sharded.check_safe(_checkpoint(tmp_path, meta))
    assert not marker.exists()


def test_pickled_objects_in_the_checkpoint_are_refused(tmp_path: Path) -> None:
    meta = Metadata(
        state_dict_metadata={
            "w": _tensor_meta(),
            "layer._extra_state/shard_0_1": BytesStorageMetadata(),
        }
    )
    with pytest.raises(CheckpointError, match="holds pickled objects"):
        sharded.check_safe(_checkpoint(tmp_path, meta))


def test_common_part_that_would_run_code_is_refused_unrun(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    meta = Metadata(state_dict_metadata={"w": _tensor_meta()})
    with pytest.raises(CheckpointError, match="unsafe or unreadable"):
        sharded.check_safe(_checkpoint(tmp_path, meta, common={"x": _Payload(marker)}))
    assert not marker.exists()


def test_missing_or_torn_metadata_is_a_checkpoint_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError):
        sharded.check_safe(tmp_path)
    (tmp_path / sharded.METADATA).write_bytes(pickle.dumps(Metadata({}))[:-5])
    with pytest.raises(CheckpointError):
        sharded.check_safe(tmp_path)


def test_metadata_that_is_not_torch_metadata_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="not torch checkpoint metadata"):
        sharded.check_safe(_checkpoint(tmp_path, torch.Size([3])))
