"""The eval-mode model as a deployable graph (ONNX, TorchScript), and its size and cost.

``export_graph(model, "onnx" | "torchscript", path, ...)`` writes the model's inference form — a
copy in eval mode, re-parameterised branches merged by the model's own ``fuse()`` where it has
one (YOLOv9, YOLOv7, YOLO-NAS) — traced at the model's input size with a dynamic batch dimension.
The graph takes one input, ``images`` (N×3×H×W float, preprocessed as the task's ``preprocess``
does), and returns a flat tuple of tensors whose order and names the task states (its
``export_outputs``, ``zoo_core/tasks``):

- detect: ``boxes`` (N×A×4, xyxy in input pixels) and ``scores`` (N×A×C, class probabilities):
  every candidate before confidence filtering and NMS, as ``model(images)["boxes"/"scores"]``;
- segment: detect's two, then ``mask_coefficients`` (N×A×K, each candidate's mask parameters) and
  ``mask_features`` (N×K'×h×w, the map they act on): a runtime builds a kept candidate's mask from
  the two, as the family's ``postprocess`` does (for YOLO: coefficients times prototypes);
- classify: ``logits`` (N×C); semantic: ``logits`` (N×C×H×W); points: ``logits`` (the heatmap);
- restore: ``image`` (N×3×H×W).

By default only the batch dimension is dynamic: height and width are those of the export (the
model's input size, or ``imgsz``), since several families compute anchors, pads or positional
embeddings from them. ``dynamic=True`` makes them dynamic too and proves it: the graph runs at a
second size against PyTorch, and one that holds its traced size fixed is refused. ``half``,
``simplify`` (onnxslim) and ``opset`` are Ultralytics' options of the same names.

``model_summary(model, input_size)`` counts layers, parameters and GFLOPs (``LibreYOLO.info``).
torch is imported on first use.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import re
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

from zoo_core.errors import ExportError

if TYPE_CHECKING:
    import numpy as np
    import torch

__all__ = ["GRAPH_FORMATS", "ONNX_OPSET", "export_graph", "inference_form", "model_summary", "graph_format", "read_graph_facts",
           "graph_model"]

# The graph formats and the suffix of their files.
GRAPH_FORMATS = {"onnx": ".onnx", "torchscript": ".torchscript"}

# 17: LayerNormalization is native, GridSample (the DETR decoders' deformable attention) exists
# since 16, and every onnxruntime of the last years runs it.
ONNX_OPSET = 17

INPUT_NAME = "images"


def _as_tuple(outputs: Any, names: Sequence[str], task: str, where: str) -> tuple["torch.Tensor", ...]:
    """The eval outputs of a model as the flat tuple the graph returns: the task's ``names``, in order."""
    import torch

    if isinstance(outputs, torch.Tensor):
        found: tuple[torch.Tensor, ...] = (outputs,)
    elif isinstance(outputs, Mapping):
        if len(names) > 1 and all(isinstance(outputs.get(name), torch.Tensor) for name in names):
            return tuple(outputs[name] for name in names)
        raise ExportError(
            f"{where}: in eval mode the model returns a dict with keys {sorted(outputs)}, but a {task} graph needs "
            f"{', '.join(names)}; its family has to return them (zoo_core/tasks/base.py)"
        )
    elif isinstance(outputs, (tuple, list)) and outputs and all(isinstance(item, torch.Tensor) for item in outputs):
        found = tuple(outputs)
    else:
        raise ExportError(f"{where}: in eval mode the model returns {type(outputs).__name__}, not tensors; it cannot be exported")
    if len(found) != len(names):
        raise ExportError(
            f"{where}: in eval mode the model returns {len(found)} tensor(s), but a {task} graph has the outputs "
            f"{', '.join(names)}; its family has to return them (zoo_core/tasks/base.py)"
        )
    return found


def _graph_module(model: "torch.nn.Module", names: Sequence[str], task: str, where: str) -> "torch.nn.Module":
    """``model`` wrapped so that it returns the flat tuple of the task's output ``names``."""
    import torch

    class ExportedGraph(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.model = inner

        def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return _as_tuple(self.model(images), names, task, where)

    return ExportedGraph(model).eval()


def inference_form(model: "torch.nn.Module") -> "torch.nn.Module":
    """A copy of ``model`` in eval mode, re-parameterised by its ``fuse()`` when it has one.

    ``model`` itself is left as it was (its mode, its branches), so training can go on.
    """
    import torch

    form = copy.deepcopy(model).eval()
    fuse = getattr(form, "fuse", None)
    if callable(fuse):
        with torch.no_grad():
            form = fuse() or form
        form.eval()
    for parameter in form.parameters():
        parameter.requires_grad_(False)
    return form


@contextlib.contextmanager
def _quiet_tracing() -> Iterator[None]:
    """Silence the tracers' notes: TracerWarnings (Python values baked into the graph — only the
    batch is dynamic, and the test suite runs every family's graph at two batch sizes) and the
    deprecation notices of torch.jit and of the TorchScript-based ONNX exporter."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.onnx")
        yield


def _reason(error: BaseException) -> str:
    """The first line of an exporter error, without the graph dump and the "please report" tail."""
    text = str(error).strip() or type(error).__name__
    text = text.splitlines()[0]
    for tail in ("  [Caused by", " Please feel free", " Please report"):
        text = text.split(tail)[0]
    return text if len(text) <= 400 else text[:400] + "..."


def _unsupported_operator(error: BaseException) -> str | None:
    """The operator an ONNX exporter error names (``aten::roll``, ``adaptive_avg_pool2d``), if any."""
    found = re.search(r"operator '?([A-Za-z_]+::[A-Za-z0-9_.]+|[A-Za-z_][A-Za-z0-9_]*)'?", _reason(error))
    return found.group(1) if found else None


def export_graph(
    model: "torch.nn.Module",
    format: str,
    path: str | Path,
    *,
    name: str,
    task: str,
    outputs: Sequence[str],
    input_size: int | Sequence[int],
    metadata: Mapping[str, Any] | None = None,
    batch: int = 1,
    opset: int = ONNX_OPSET,
    half: bool = False,
    dynamic: bool = False,
    simplify: bool = False,
    size_multiple: int = 32,
) -> Path:
    """Write ``model``'s inference form as ``format`` (``"onnx"`` or ``"torchscript"``) to ``path``.

    Args:
        model: the built model (left unchanged: a fused copy is exported).
        name: the model's name (``yolo9-t``), for messages.
        task: the model's task (recorded with the graph); ``outputs``: the names of the graph's
            outputs, in order (the task's ``export_outputs``).
        input_size: the traced height and width (an int is square).
        metadata: JSON-able facts stored with the graph (ONNX: metadata properties, when the
            ``onnx`` package is installed; TorchScript: the extra file ``zoo.json``).
        batch: the batch of the example input; the exported batch dimension is dynamic.
        opset: the ONNX opset (default ``ONNX_OPSET``).
        half: a float16 graph (float16 weights and ``images``), as Ultralytics' ``half=True``; onnxruntime and
            torch run it on the CPU too, where it is slower than float32 (it is meant for GPUs).
        dynamic: height and width dynamic too (Ultralytics' ``dynamic=True``). Many families compute anchors,
            pads or positional embeddings from the traced size, which a graph then holds fixed; so the graph is
            run at a second size (``input_size`` plus ``size_multiple``) against PyTorch, and a graph that
            disagrees is an ``ExportError`` instead of a file that is wrong at any other size.
        simplify: an ONNX graph simplified by onnxslim (constant folding, redundant nodes removed).

    Raises ``ExportError`` naming the model and, for an operator without an ONNX mapping, the
    operator.
    """
    import torch

    if format not in GRAPH_FORMATS:
        raise ExportError(f"unknown graph format {format!r}; the formats are {', '.join(GRAPH_FORMATS)}")
    if simplify and format != "onnx":
        raise ExportError(f"simplify=True simplifies ONNX graphs (onnxslim); {format} has nothing to simplify: leave it out")
    if not isinstance(opset, int) or not 11 <= opset <= 23:
        raise ExportError(f"opset={opset!r}: give an ONNX opset from 11 to 23 (default {ONNX_OPSET})")
    if not isinstance(batch, int) or batch < 1:
        raise ExportError(f"batch={batch!r}: the example batch must be a positive integer (the exported batch stays dynamic)")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    height, width = (input_size, input_size) if isinstance(input_size, int) else tuple(input_size)
    dtype = torch.float16 if half else torch.float32
    example = torch.rand(batch, 3, int(height), int(width), generator=torch.Generator().manual_seed(0)).to(dtype)
    form = inference_form(model).to(dtype)
    graph = _graph_module(form, outputs, task, name)
    with torch.no_grad():
        graph(example)  # a model whose outputs are not the task's fails here, before any file is written
    names = tuple(outputs)
    facts = {"name": name, "task": task, "input_size": [int(height), int(width)], "inputs": [INPUT_NAME],
             "outputs": list(names), "half": half, "dynamic": dynamic, **dict(metadata or {})}
    temporary = path.with_name(f".{path.name}.partial")
    try:
        with _quiet_tracing(), torch.no_grad():
            if format == "onnx":
                _write_onnx(graph, example, temporary, names, facts, name, opset=opset, dynamic_size=dynamic, simplify=simplify)
            else:
                _write_torchscript(graph, example, temporary, facts, name)
        if dynamic:
            other = (int(height) + size_multiple, int(width) + size_multiple)
            _check_at_another_size(graph, temporary, format, other, dtype, name)
        temporary.replace(path)
    finally:
        temporary.unlink(missing_ok=True)
    return path


def _run_graph(path: Path, format: str, images: "torch.Tensor") -> list[np.ndarray]:
    """The outputs of the exported graph at ``path`` on ``images``, through its runtime."""
    import numpy as np
    import torch

    if format == "torchscript":
        with torch.no_grad():
            found = torch.jit.load(str(path))(images)
        return [output.float().numpy() for output in (found if isinstance(found, (tuple, list)) else (found,))]
    try:
        import onnxruntime
    except ImportError:
        raise ExportError("dynamic=True runs the graph at a second size with onnxruntime to check it; "
                          "pip install onnxruntime, or export without dynamic") from None
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 4  # a graph that fails at the other size becomes our error, not a runtime log line
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return [np.asarray(output, dtype=np.float32) for output in session.run(None, {INPUT_NAME: images.numpy()})]


def _check_at_another_size(graph: "torch.nn.Module", path: Path, format: str, size: tuple[int, int], dtype: "torch.dtype",
                           name: str) -> None:
    """``ExportError`` unless the graph at ``path`` computes what PyTorch computes at ``size`` (not the traced one)."""
    import numpy as np
    import torch

    images = torch.rand(1, 3, *size, generator=torch.Generator().manual_seed(1)).to(dtype)
    with torch.no_grad():
        expected = [output.float().numpy() for output in graph(images)]
    try:
        found = _run_graph(path, format, images)
    except ExportError:
        raise
    except Exception as error:  # noqa: BLE001 - a runtime that refuses the other size: the graph fixed it
        raise ExportError(f"{name} cannot be exported with dynamic=True: its graph does not run at {size[0]}x{size[1]} "
                          f"({_reason(error)}); export without dynamic, at the imgsz you will run") from None
    tolerance = 1e-2 if dtype == torch.float16 else 1e-3
    for output_name, want, got in zip(graph_output_names(path, format), expected, found):
        scale = max(float(np.abs(want).max()), 1.0)
        if want.shape != got.shape or float(np.abs(want - got).max()) > tolerance * scale:
            raise ExportError(
                f"{name} cannot be exported with dynamic=True: at {size[0]}x{size[1]} its graph's {output_name} differs from "
                "PyTorch's (the family computes anchors, pads or positions from the traced size, which the graph holds "
                "fixed); export without dynamic, at the imgsz you will run"
            )


def graph_output_names(path: Path, format: str) -> list[str]:
    """The output names an exported graph's metadata records (ONNX: its outputs; TorchScript: ``zoo.json``)."""
    import torch

    if format == "torchscript":
        files = {"zoo.json": ""}
        torch.jit.load(str(path), _extra_files=files)
        return list(json.loads(files["zoo.json"] or "{}").get("outputs", []))
    import onnxruntime

    return [output.name for output in onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"]).get_outputs()]


def _write_onnx(graph: "torch.nn.Module", example: "torch.Tensor", path: Path, names: Sequence[str],
                facts: Mapping[str, Any], name: str, *, opset: int = ONNX_OPSET, dynamic_size: bool = False,
                simplify: bool = False) -> None:
    import torch

    # The TorchScript-based exporter (dynamo=False): torch 2.14 still ships it, it needs no package
    # beyond torch, and it exports every family. The torch.export-based default (dynamo=True)
    # needs the separate `onnxscript` package, which zoo does not depend on.
    input_axes = {0: "batch", 2: "height", 3: "width"} if dynamic_size else {0: "batch"}
    dynamic = {INPUT_NAME: input_axes, **{output: {0: "batch"} for output in names}}
    try:
        torch.onnx.export(
            graph, (example,), str(path), dynamo=False, input_names=[INPUT_NAME], output_names=list(names),
            dynamic_axes=dynamic, opset_version=opset, do_constant_folding=True,
        )
    except ExportError:
        raise
    except Exception as error:  # noqa: BLE001 - every exporter failure becomes one clear error
        operator = _unsupported_operator(error)
        where = f"the operator {operator} has no ONNX export here (opset {opset}): " if operator else ""
        raise ExportError(f"{name} cannot be exported to ONNX: {where}{_reason(error)}") from error
    if simplify:
        _simplify_onnx(path, name)
    _add_onnx_metadata(path, facts)


def _simplify_onnx(path: Path, name: str) -> None:
    """The ONNX graph at ``path`` simplified in place by onnxslim (what Ultralytics' ``simplify=True`` runs)."""
    try:
        import onnxslim
    except ImportError:
        raise ExportError("simplify=True needs the onnxslim package: pip install 'zoo-core[export]' (or onnxslim), "
                          "or export without simplify") from None
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # onnxslim prints a table of the graph before and after
            onnxslim.slim(str(path), str(path))
    except Exception as error:  # noqa: BLE001
        raise ExportError(f"{name}: onnxslim could not simplify the graph ({_reason(error)}); export without simplify") from error


def _add_onnx_metadata(path: Path, facts: Mapping[str, Any]) -> None:
    """Store ``facts`` as the graph's metadata properties (skipped without the ``onnx`` package)."""
    try:
        import onnx
    except ImportError:
        return
    proto = onnx.load(str(path))
    for key, value in facts.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = f"zoo.{key}", value if isinstance(value, str) else json.dumps(value)
    onnx.save(proto, str(path))


def _write_torchscript(graph: "torch.nn.Module", example: "torch.Tensor", path: Path, facts: Mapping[str, Any],
                       name: str) -> None:
    import torch

    # Traced rather than scripted: the families' forward passes use Python freely (dicts, loops
    # over levels, dataclasses), which torch.jit.script rejects; tracing records the tensor ops,
    # sizes included, so the batch stays dynamic.
    try:
        traced = torch.jit.trace(graph, (example,), check_trace=False, strict=False)
    except Exception as error:  # noqa: BLE001
        raise ExportError(f"{name} cannot be exported to TorchScript: {_reason(error)}") from error
    torch.jit.save(traced, str(path), _extra_files={"zoo.json": json.dumps(facts)})


def model_summary(model: "torch.nn.Module", input_size: int | Sequence[int]) -> dict[str, Any]:
    """Layers, parameters and GFLOPs of ``model`` on one image of ``input_size``.

    ``layers`` counts the modules that hold parameters of their own (a conv, a norm, a linear);
    ``parameters`` counts every parameter. ``gflops`` is torch's ``FlopCounterMode`` count of one
    eval-mode forward pass at batch 1, in the usual convention of 2 FLOPs per multiply-add
    (GFLOPs = 2 × GMACs; resnet18 at 224: 1.8 GMACs, 3.6 GFLOPs). It counts matrix products and
    convolutions (attention included), not element-wise operations or normalisations, and is
    taken on the model as built: re-parameterisable branches count unmerged. None when the
    forward pass fails at that size.
    """
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    layers = sum(1 for module in model.modules() if any(True for _ in module.parameters(recurse=False)))
    parameters = sum(parameter.numel() for parameter in model.parameters())
    height, width = (input_size, input_size) if isinstance(input_size, int) else tuple(input_size)
    parameter = next(model.parameters(), None)
    device = parameter.device if parameter is not None else torch.device("cpu")
    was_training = model.training
    counter = FlopCounterMode(display=False)
    gflops: float | None
    try:
        model.eval()
        with torch.no_grad(), counter:
            model(torch.zeros(1, 3, int(height), int(width), device=device))
        gflops = counter.get_total_flops() / 1e9
    except Exception:  # noqa: BLE001 - a summary never fails; the count is unknown
        gflops = None
    finally:
        model.train(was_training)
    return {"layers": layers, "parameters": parameters, "gflops": gflops}


# ---------------------------------------------------------------------------- exported graphs loaded back
def graph_format(path: Path) -> str | None:
    """``"onnx"`` or ``"torchscript"`` for a file of that format (by its suffix), else None."""
    suffix = Path(path).suffix.lower()
    return next((name for name, known in GRAPH_FORMATS.items() if known == suffix), None)


def read_graph_facts(path: Path) -> dict[str, Any]:
    """The facts ``export_graph`` stored with the graph at ``path`` (family, size, names, input size, outputs, half...).

    ONNX: its metadata properties (``zoo.*``, read through onnxruntime); TorchScript: its ``zoo.json``. An
    ``ExportError`` names a graph zoo did not write (no facts) or a runtime that is missing.
    """
    import torch

    format = graph_format(path)
    if format == "torchscript":
        files = {"zoo.json": ""}
        try:
            torch.jit.load(str(path), map_location="cpu", _extra_files=files)
        except RuntimeError as error:
            raise ExportError(f"{path}: not a TorchScript file torch can load ({_reason(error)})") from None
        facts = json.loads(files["zoo.json"] or "{}")
    else:
        try:
            import onnxruntime
        except ImportError:
            raise ExportError(f"{path}: running an ONNX graph needs onnxruntime: pip install onnxruntime") from None
        try:
            session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        except Exception as error:  # noqa: BLE001 - onnxruntime raises its own exception types
            raise ExportError(f"{path}: not an ONNX graph onnxruntime can load ({_reason(error)})") from None
        facts = {}
        for key, value in session.get_modelmeta().custom_metadata_map.items():
            if key.startswith("zoo."):
                try:
                    facts[key[4:]] = json.loads(value)
                except json.JSONDecodeError:
                    facts[key[4:]] = value  # the strings (name, task) are stored as they are
    missing = [key for key in ("family", "size", "names", "task", "input_size", "outputs") if key not in facts]
    if missing:
        raise ExportError(f"{path}: the graph carries no zoo metadata ({', '.join(missing)} missing), so zoo cannot tell "
                          "which model it is; load graphs that LibreYOLO(...).export() wrote")
    facts["names"] = {int(index): str(name) for index, name in dict(facts["names"]).items()}
    return facts


def graph_model(path: Path, facts: Mapping[str, Any], family_model: "torch.nn.Module", device: "torch.device") -> "torch.nn.Module":
    """The graph at ``path`` as the model ``predict`` and ``val`` run: its runtime computes the outputs the family's
    eval model would (a tensor, or a dict of the task's outputs), and ``family_model``'s ``postprocess`` reads them.

    ONNX runs in onnxruntime (CUDA where ``device`` is a GPU and the CUDA provider is installed, else the CPU),
    TorchScript in ``torch.jit``. A graph exported at a fixed size refuses images of another size by name.
    """
    import numpy as np
    import torch

    format = graph_format(path)
    names = list(facts["outputs"])
    fixed_size = None if facts.get("dynamic") else tuple(int(side) for side in facts["input_size"])
    input_type = torch.float16 if facts.get("half") else torch.float32

    class ExportedGraphModel(torch.nn.Module):
        """An exported graph behind the family model's interface (``forward`` by the runtime, ``postprocess``)."""

        def __init__(self) -> None:
            super().__init__()
            self.family_model = family_model.eval()
            if format == "torchscript":
                self.runtime = torch.jit.load(str(path), map_location=device)
            else:
                import onnxruntime

                providers = ["CPUExecutionProvider"]
                if device.type == "cuda" and "CUDAExecutionProvider" in onnxruntime.get_available_providers():
                    providers.insert(0, "CUDAExecutionProvider")
                self.session = onnxruntime.InferenceSession(str(path), providers=providers)

        def forward(self, images: torch.Tensor) -> Any:
            if fixed_size is not None and tuple(images.shape[-2:]) != fixed_size:
                raise ExportError(f"{path} was exported at {fixed_size[0]}×{fixed_size[1]} and runs only at that size, got "
                                  f"{images.shape[-2]}×{images.shape[-1]}; pass imgsz={list(fixed_size)}, or export with "
                                  "dynamic=True")
            if format == "torchscript":
                with torch.no_grad():
                    found = self.runtime(images.to(input_type))
                outputs = [output.float() for output in (found if isinstance(found, (tuple, list)) else (found,))]
            else:
                feed = {INPUT_NAME: images.detach().to(input_type).cpu().numpy()}
                outputs = [torch.from_numpy(np.asarray(output, dtype=np.float32)).to(images.device)
                           for output in self.session.run(names, feed)]
            return dict(zip(names, outputs)) if len(names) > 1 else outputs[0]

        def postprocess(self, *args: Any, **kwargs: Any) -> Any:
            return self.family_model.postprocess(*args, **kwargs)

    return ExportedGraphModel().to(device).eval()
