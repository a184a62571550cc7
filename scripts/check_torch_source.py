"""Run hooktrace's torch source checks against another torch's Python sources, without installing it.

    python scripts/check_torch_source.py ROOT

ROOT holds that torch's `torch/` folder (an unpacked wheel, or a checkout of PyTorch's public source
at a release tag); nothing of it is copied into this repository. What is checked, each on ROOT's
files, with the torch installed here only as the namespace the rewritten copies compile in:

- the capture's rewrites (capture/views.py `_Copies`, the same code and arguments as
  `views.copies()` and `optim.copies()`): every method of `nn.Module` and `torch.optim.Optimizer`
  that reads a hook dict is read from ROOT's module.py / optimizer.py, rewritten, checked (each hook
  dict read somewhere, every other naming a truthiness or membership test, each edit applied, the
  required methods found) and compiled; the step wrapper of `Optimizer.profile_hook_step`, copied
  and as it is, reads the same free names;
- every function, method and hook dict that the capture patches or reads by name exists in ROOT's
  sources (the registration methods of each hook kind, the global hook dicts, `RemovableHandle`,
  `BackwardHook.setup_output_hook`, `_HookMixin._register_hook`, `saved_tensors_hooks.__enter__`,
  the C functions' stubs, DDP's `register_comm_hook`, `torch.compiler.is_compiling`, ...);
- Dynamo's names that capture/compiled.py (the compiled-forward and compiled-autograd patches),
  capture/dynamo.py (the frames Dynamo skips) and capture/views.py (whether a compile is under way)
  read exist in ROOT's sources, and the functions compiled.py patches or wraps take the parameters
  it accepts (the same lists it checks at run time: `inline_call`, `call_user_compiler`,
  `end_capture` and the runtime wrapper it returns).

Prints one line per check and `N passed, N failed`; exits 0 when every check passed, else 1; 2 on bad
input. README "Torch versions" says which torch was checked this way (2.15.0).
"""

from __future__ import annotations

import ast
import re
import sys
import types
from pathlib import Path
from typing import Any

import torch.nn.modules.module as nn_module
import torch.optim.optimizer as optim_module

from hooktrace import kinds
from hooktrace.capture import compiled, dicts, dynamo, modulecall, optim, registry, views

MODULE_PY = "torch/nn/modules/module.py"
OPTIMIZER_PY = "torch/optim/optimizer.py"

# (file under ROOT, dotted name defined there) for what the capture patches or reads by name
NAMES: list[tuple[str, str]] = [
    ("torch/utils/hooks.py", "RemovableHandle.__init__"),
    ("torch/utils/hooks.py", "RemovableHandle.remove"),
    ("torch/utils/hooks.py", "BackwardHook.setup_output_hook"),
    ("torch/utils/hooks.py", "BackwardHook.setup_input_hook"),
    ("torch/autograd/function.py", "_HookMixin._register_hook"),
    ("torch/autograd/graph.py", "saved_tensors_hooks.__enter__"),
    ("torch/autograd/graph.py", "saved_tensors_hooks.__exit__"),
    ("torch/autograd/graph.py", "save_on_cpu"),
    ("torch/autograd/profiler.py", "record_function"),
    ("torch/compiler/__init__.py", "is_compiling"),
    ("torch/_C/_autograd.pyi", "_push_saved_tensors_default_hooks"),
    ("torch/_C/_autograd.pyi", "SavedTensor"),
    ("torch/_C/__init__.pyi", "_current_graph_task_id"),
    ("torch/_C/_distributed_c10d.pyi", "_register_comm_hook"),
    ("torch/nn/parallel/distributed.py", "DistributedDataParallel.register_comm_hook"),
    ("torch/nn/modules/module.py", "Module._call_impl"),
    ("torch/nn/modules/module.py", "Module.__call__"),
    ("torch/optim/optimizer.py", "Optimizer.profile_hook_step"),
    ("torch/optim/optimizer.py", "Optimizer._patch_step_function"),
    *((MODULE_PY, f"Module.{name}") for name, _ in registry.MODULE_METHODS),
    *((MODULE_PY, name) for name, _ in registry.GLOBAL_FUNCTIONS),
    *((MODULE_PY, name) for name, _ in dicts.GLOBAL_DICTS),
    ("torch/_tensor.py", "Tensor.register_hook"),
    *(("torch/_tensor.py", f"Tensor.{name}") for name, _ in registry.TENSOR_METHODS),
    *((OPTIMIZER_PY, f"Optimizer.{name}") for name, _ in registry.OPTIMIZER_METHODS),
    *((OPTIMIZER_PY, name) for name, _ in registry.OPTIMIZER_FUNCTIONS),
    *((OPTIMIZER_PY, name) for name, _ in dicts.GLOBAL_OPTIMIZER_DICTS),
]
# what capture/compiled.py, capture/dynamo.py and capture/views.py read of Dynamo by name
DYNAMO_NAMES: list[tuple[str, str]] = [
    ("torch/_dynamo/symbolic_convert.py", "InliningInstructionTranslator.inline_call"),
    ("torch/_dynamo/output_graph.py", "OutputGraph.call_user_compiler"),
    ("torch/_dynamo/output_graph.py", "OutputGraph.side_effects"),
    ("torch/_dynamo/output_graph.py", "OutputGraph.graph"),
    ("torch/_dynamo/output_graph.py", "OutputGraph.get_submodule"),
    ("torch/_dynamo/side_effects.py", "SideEffects.is_modified"),
    ("torch/_dynamo/compiled_autograd.py", "AutogradCompilerInstance.end_capture"),
    ("torch/_dynamo/external_utils.py", "call_hook"),
    ("torch/fx/_lazy_graph_module.py", "_LazyGraphModule.force_recompile"),
    *(("torch/_dynamo/variables/nn_module.py", name) for name in sorted(dynamo.MODULE_VARIABLES)),
    ("torch/_dynamo/variables/nn_module.py", "unpatched_nn_module_call"),
    ("torch/_C/_dynamo/eval_frame.pyi", "set_code_exec_strategy"),
    ("torch/_C/_dynamo/eval_frame.pyi", "_FrameExecStrategy"),
    ("torch/_C/_dynamo/eval_frame.pyi", "_FrameAction.SKIP"),
    ("torch/_C/_dynamo/eval_frame.pyi", "_FrameAction.DEFAULT"),
]
# views.py tells a compile under way by is_compiling() where torch has `_compile_session_context` (2.13
# on: True all through a compile), else by Dynamo's CompileContext as well: one of the two
COMPILE_MARK = ("torch/compiler/__init__.py", "_compile_session_context")
COMPILE_CONTEXT = ("torch/_guards.py", "CompileContext.try_get")
# attributes dynamo.py's `footprint` reads of an OutputGraph's side effects, set in SideEffects.__init__
DYNAMO_ATTRS: list[tuple[str, str]] = [
    ("torch/_dynamo/side_effects.py", attr)
    for attr in ("id_to_variable", "store_attr_mutations", "tensor_hooks")
]
# (file, def (a nested one as `Class.method.inner`), the parameter lists compiled.py accepts, as
# `inspect.signature` gives them: a classmethod's without `cls`, a method read from its class with `self`)
SIGNATURES: list[tuple[str, str, tuple[list[str], ...]]] = [
    (
        "torch/_dynamo/symbolic_convert.py",
        "InliningInstructionTranslator.inline_call",
        (compiled._INLINE_PARAMS, compiled._INLINE_PARAMS_OLD),
    ),
    ("torch/_dynamo/output_graph.py", "OutputGraph.call_user_compiler", (compiled._COMPILER_PARAMS,)),
    (
        "torch/_dynamo/compiled_autograd.py",
        "AutogradCompilerInstance.end_capture",
        (compiled._END_CAPTURE_PARAMS,),
    ),
    (
        "torch/_dynamo/compiled_autograd.py",
        "AutogradCompilerInstance.end_capture.runtime_wrapper",
        (compiled._RUNTIME_PARAMS,),
    ),
]
# a module's hook dict is set in `Module.__init__` (or `__setstate__`) as `self.<attr>`, an
# optimizer's in `Optimizer.__init__`/`_patch_step_function` as `self.<attr>`
ATTRS: list[tuple[str, str]] = [
    *((MODULE_PY, attr) for attr, _ in dicts.MODULE_DICTS),
    *((OPTIMIZER_PY, attr) for attr, _ in dicts.OPTIMIZER_DICTS),
]


def _defined(tree: ast.Module) -> set[str]:
    """Dotted names defined at a module's top level and one class level down (`Class.method`)."""
    out: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
            if isinstance(node, ast.ClassDef):
                for inner in node.body:
                    if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        out.add(f"{node.name}.{inner.name}")
                    elif isinstance(inner, (ast.Assign, ast.AnnAssign)):
                        for target in inner.targets if isinstance(inner, ast.Assign) else [inner.target]:
                            if isinstance(target, ast.Name):
                                out.add(f"{node.name}.{target.id}")
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name):
                    out.add(target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out.update((a.asname or a.name).split(".")[0] for a in node.names)
    return out


class Sources:
    """The methods of one class of ROOT's file, as functions the capture's rewriter can take."""

    def __init__(self, path: Path, module: types.ModuleType, class_name: str) -> None:
        self.text = path.read_text(encoding="utf-8")
        lines = self.text.splitlines(keepends=True)
        tree = ast.parse(self.text, str(path))
        node = next(
            (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name),
            None,
        )
        if node is None:
            raise SystemExit(f"error: {path} defines no class {class_name}")
        self.lines: dict[str, tuple[list[str], int]] = {}
        attrs: dict[str, Any] = {}
        for item in node.body:
            if not isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            first = min([item.lineno, *(d.lineno for d in item.decorator_list)])
            qualname = f"{class_name}.{item.name}"
            self.lines[qualname] = (lines[first - 1 : item.end_lineno], first)
            fn = types.FunctionType(_placeholder.__code__, {}, item.name)
            fn.__module__, fn.__qualname__ = module.__name__, qualname
            if any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in item.decorator_list):
                attrs[item.name] = staticmethod(fn)
            elif any(isinstance(d, ast.Name) and d.id == "classmethod" for d in item.decorator_list):
                attrs[item.name] = classmethod(fn)
            else:
                attrs[item.name] = fn
        self.cls = type(class_name, (), attrs)
        # ROOT's file, with the installed module's names: the copies' decorators and globals
        self.module = types.ModuleType(module.__name__)
        self.module.__dict__.update({k: v for k, v in vars(module).items() if k not in ("__name__",)})
        self.module.__file__ = str(path)

    def source(self, fn: Any) -> tuple[list[str], int]:
        try:
            return self.lines[fn.__qualname__]
        except KeyError:
            raise OSError(fn.__qualname__) from None

    def compiled(self, name: str) -> Any:
        """A method as ROOT's source has it, compiled unchanged in a class body (as the copies are)."""
        lines, first = self.lines[f"{self.cls.__name__}.{name}"]
        code = compile("class _as_it_is:\n" + "".join(lines), self.module.__file__ or "", "exec")
        namespace = dict(vars(self.module))
        exec(code, namespace)  # noqa: S102
        return vars(namespace["_as_it_is"])[name]


def _placeholder() -> None:
    """Stands for a method of ROOT's source; only its name and source are read."""


class Checks:
    def __init__(self) -> None:
        self.passed = 0
        self.failed: list[str] = []

    def run(self, what: str, check: Any) -> None:
        try:
            detail = check()
        except (views.UnsupportedTorch, OSError, SyntaxError, NameError, AttributeError, KeyError) as exc:
            self.failed.append(what)
            print(f"FAIL {what}: {type(exc).__name__}: {exc}")
            return
        self.passed += 1
        print(f"ok   {what}" + (f": {detail}" if detail else ""))


def _module_copies(src: Sources) -> str:
    original = views._source
    views._source = src.source
    try:
        made = views._Copies(
            src.cls,
            src.module,
            views._READ,
            ((views._REBOUND, views._MODULE_NAME + r".\1"), views._FORWARD_READ, *views._OUTPUT_READS),
            {"_hooktrace_forward": views.hooktrace_forward, "_hooktrace_output": views.hooktrace_output},
            frozenset({"_call_impl"}),
            (views._COMPILING_READ,),
            required=views._MODULE_METHODS,
            reads=frozenset(attr for attr, _ in dicts.MODULE_DICTS + dicts.GLOBAL_DICTS),
            mention=views._MENTION,
        )
    finally:
        views._source = original
    return f"{len(made.copies)} methods rewritten: {', '.join(sorted(made.copies))}"


def _call_swappable(src: Sources) -> str:
    """ROOT's `_wrapped_call_impl`, compiled as the installed module's, is the one whose code the
    capture swaps (else it sets its wrapper on the class, a slower start and end of a session)."""
    fn = src.compiled("_wrapped_call_impl")
    fn = types.FunctionType(fn.__code__, vars(nn_module), fn.__name__)
    if not modulecall.swappable(fn):
        raise AttributeError("_wrapped_call_impl is not the body capture/modulecall.py expects")
    return "_wrapped_call_impl as expected"


def _optimizer_copies(src: Sources) -> str:
    original = views._source
    views._source = src.source
    try:
        made = views._Copies(
            src.cls,
            src.module,
            optim._READ,
            (optim._STEP_MARK, optim._STEP_CALL),
            substitute=optim._substitute,
            required=frozenset({"profile_hook_step", "state_dict", "load_state_dict"}),
            reads=frozenset(optim.ATTRS + tuple(attr for attr, _ in dicts.GLOBAL_OPTIMIZER_DICTS)),
            mention=optim._MENTION,
        )
    finally:
        views._source = original
    copied = optim._wrapper_code(made.copies["profile_hook_step"])
    own = optim._wrapper_code(src.compiled("profile_hook_step"))
    if copied is None or own is None:
        raise views.unsupported("Optimizer.profile_hook_step does not make one step wrapper")
    if own.co_freevars != copied.co_freevars:
        raise views.unsupported("the copied step wrapper of Optimizer.profile_hook_step reads other names")
    return f"{len(made.copies)} methods rewritten: {', '.join(sorted(made.copies))}; step wrapper reads {own.co_freevars}"


def _name_defined(root: Path, trees: dict[str, ast.Module], rel: str, name: str) -> None:
    if rel not in trees:
        trees[rel] = ast.parse((root / rel).read_text(encoding="utf-8"), rel)
    if name not in _defined(trees[rel]):
        raise KeyError(f"{rel} does not define {name}")


def _def(tree: ast.Module, rel: str, dotted: str) -> Any:
    """The class or function `dotted` names: `Class.method` one level down, a further part a def
    anywhere inside the function before it."""
    node: Any = tree
    for part in dotted.split("."):
        inside = node.body if isinstance(node, (ast.Module, ast.ClassDef)) else list(ast.walk(node))[1:]
        node = next(
            (
                n
                for n in inside
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == part
            ),
            None,
        )
        if node is None:
            raise KeyError(f"{rel} does not define {dotted}")
    return node


def _signature(
    root: Path, trees: dict[str, ast.Module], rel: str, dotted: str, accepted: tuple[list[str], ...]
) -> str:
    if rel not in trees:
        trees[rel] = ast.parse((root / rel).read_text(encoding="utf-8"), rel)
    node = _def(trees[rel], rel, dotted)
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        raise KeyError(f"{rel}: {dotted} is not a function")
    a = node.args
    params = [p.arg for p in (*a.posonlyargs, *a.args)]
    params += [a.vararg.arg] if a.vararg else []
    params += [p.arg for p in a.kwonlyargs] + ([a.kwarg.arg] if a.kwarg else [])
    if any(isinstance(d, ast.Name) and d.id == "classmethod" for d in node.decorator_list):
        params = params[1:]  # read through the class: bound, without cls
    if params not in [list(names) for names in accepted]:
        raise KeyError(
            f"{rel}: {dotted} takes ({', '.join(params)}), hooktrace reads one of {list(accepted)}"
        )
    return f"({', '.join(params)})"


def _compile_test(root: Path, trees: dict[str, ast.Module]) -> str:
    try:
        _name_defined(root, trees, *COMPILE_MARK)
        return "is_compiling() all through a compile (torch.compiler._compile_session_context, 2.13 on)"
    except KeyError:
        _name_defined(root, trees, *COMPILE_CONTEXT)
        return "before 2.13: is_compiling() or torch._guards.CompileContext.try_get()"


def _attr_set(root: Path, rel: str, attr: str) -> None:
    text = (root / rel).read_text(encoding="utf-8")
    if not re.search(rf"\bself\.{re.escape(attr)}\b|[\"']{re.escape(attr)}[\"']", text):
        raise KeyError(f"{rel} never names the hook dict {attr}")


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not (Path(argv[0]) / MODULE_PY).is_file():
        print(
            "error: usage: python scripts/check_torch_source.py ROOT (ROOT holds torch/nn/modules/module.py)",
            file=sys.stderr,
        )
        return 2
    root = Path(argv[0])
    version = root / "torch" / "version.py"
    if version.is_file():
        found = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", version.read_text(encoding="utf-8"))
        print(f"torch source in {root}: {found.group(1) if found else '?'}")
    checks = Checks()
    module_src = Sources(root / MODULE_PY, nn_module, "Module")
    optimizer_src = Sources(root / OPTIMIZER_PY, optim_module, "Optimizer")
    checks.run("nn.Module's hook-dict reads rewritten (capture/views.py)", lambda: _module_copies(module_src))
    checks.run(
        "nn.Module.__call__ takes the module-call wrapper's code (capture/modulecall.py)",
        lambda: _call_swappable(module_src),
    )
    checks.run(
        "Optimizer's hook-dict reads and step wrapper rewritten (capture/optim.py)",
        lambda: _optimizer_copies(optimizer_src),
    )
    trees: dict[str, ast.Module] = {}
    for rel, name in dict.fromkeys(NAMES):
        checks.run(f"{rel} defines {name}", lambda rel=rel, name=name: _name_defined(root, trees, rel, name))
    for rel, attr in dict.fromkeys(ATTRS):
        checks.run(f"{rel} names the hook dict {attr}", lambda rel=rel, attr=attr: _attr_set(root, rel, attr))
    for rel, name in DYNAMO_NAMES:
        checks.run(f"{rel} defines {name}", lambda rel=rel, name=name: _name_defined(root, trees, rel, name))
    checks.run("a compile under way can be told (capture/views.py)", lambda: _compile_test(root, trees))
    for rel, attr in DYNAMO_ATTRS:
        checks.run(f"{rel} sets {attr}", lambda rel=rel, attr=attr: _attr_set(root, rel, attr))
    for rel, dotted, accepted in SIGNATURES:
        checks.run(
            f"{rel}: {dotted} takes the parameters hooktrace reads",
            lambda rel=rel, dotted=dotted, accepted=accepted: _signature(root, trees, rel, dotted, accepted),
        )
    kinds_seen = sorted({kind for _, kind in registry.MODULE_METHODS + registry.TENSOR_METHODS})
    print(
        f"hook kinds whose registration was checked: {', '.join(kinds_seen)} (and {len(kinds.KINDS)} kinds in all)"
    )
    print(f"{checks.passed} passed, {len(checks.failed)} failed")
    return 0 if not checks.failed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
