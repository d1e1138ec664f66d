# The wrapper of `code.exec --lang cpython`: runs the program given on stdin with its
# tools as functions, over the kernel's syscall socket; the last line of stdout is the
# outcome, after a marker the kernel chose.
import ast, json, os, socket, sys, traceback, types

_req = json.loads(sys.stdin.buffer.read())
_marker = os.environ.pop("KEEL_EXEC_MARKER")
_sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
_sock.connect(os.environ.pop("KEEL_SOCKET"))
_file = _sock.makefile("rb")
_ids = iter(range(1, 1 << 62))
_calls = []
_max_calls = _req["max_tool_calls"]
_max_llm_calls = _req["max_llm_calls"]
_llm_made = 0
_LLM_BATCH = 8  # model calls of one llm_batch in flight at once


def _rpc(method, params):
    ident = next(_ids)
    line = json.dumps({"jsonrpc": "2.0", "id": ident, "method": method, "params": params})
    _sock.sendall(line.encode() + b"\n")
    reply = json.loads(_file.readline() or b"null")
    if reply is None:
        raise ConnectionError("the kernel closed the connection")
    if "error" in reply:
        raise ToolError(reply["error"].get("message", "tool call failed"))
    return reply["result"]


class ToolError(Exception):
    """A tool call failed (denied, bad arguments, the tool's own error)."""


_rpc("hello", {"token": os.environ.pop("KEEL_EXEC_TOKEN")})


class LLMError(RuntimeError):
    """A model call failed (budget exhausted, provider error, ...): the kernel's message. A
    RuntimeError, as in the python and javascript languages."""


def _chat_params(prompt, system=None, model=None, max_tokens=None):
    if not isinstance(prompt, str):
        raise TypeError("llm(prompt, system=None, model=None, max_tokens=None) takes the prompt as a string")
    for name, value in (("system", system), ("model", model)):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"llm(): `{name}` must be a string or None")
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens <= 0):
        raise TypeError("llm(): `max_tokens` must be a positive int or None")
    messages = ([{"role": "system", "content": system}] if system is not None else []) + [
        {"role": "user", "content": prompt}
    ]
    params = {"messages": messages}
    if model is not None:
        params["model"] = model
    if max_tokens is not None:
        params["max_tokens"] = max_tokens
    return params


def _count_llm(n):
    # Passing the limit ends the program, whatever it catches: the outcome is written and
    # the process exits at once (the kernel refuses further calls too).
    global _llm_made
    if _llm_made + n > _max_llm_calls:
        message = (f"the program asked for more than {_max_llm_calls} LLM calls ({_llm_made} made, {n} more "
                   "asked); filter or chunk the input into fewer calls, or raise max_llm_calls (--max-llm-calls)")
        _finish({"error": {"kind": "llm_call_limit", "message": message}}, hard=True)
    _llm_made += n


def _text(result):
    return ((result or {}).get("message") or {}).get("content") or ""


def llm(prompt, system=None, model=None, max_tokens=None):
    """One model call (an llm.chat of the run); returns its text."""
    params = _chat_params(prompt, system, model, max_tokens)
    _count_llm(1)
    try:
        return _text(_rpc("llm.chat", params))
    except ToolError as err:
        raise LLMError(str(err)) from None


def llm_batch(prompts, system=None, model=None, max_tokens=None):
    """Several model calls, up to 8 at once; returns their texts in order."""
    if not isinstance(prompts, (list, tuple)):
        raise TypeError("llm_batch(prompts, ...) takes a list of prompts (strings, or dicts with prompt, "
                        "system, model, max_tokens)")
    requests = []
    for index, item in enumerate(prompts):
        if isinstance(item, str):
            requests.append(_chat_params(item, system, model, max_tokens))
        elif isinstance(item, dict) and isinstance(item.get("prompt"), str):
            unknown = set(item) - {"prompt", "system", "model", "max_tokens"}
            if unknown:
                raise TypeError(f"llm_batch(): prompt {index} has unknown keys {sorted(unknown)}")
            requests.append(_chat_params(item["prompt"], item.get("system", system), item.get("model", model),
                                         item.get("max_tokens", max_tokens)))
        else:
            raise TypeError(f"llm_batch(): prompt {index} is neither a string nor a dict with a string `prompt`")
    _count_llm(len(requests))
    answers = [None] * len(requests)
    for start in range(0, len(requests), _LLM_BATCH):
        window = {}
        for index in range(start, min(start + _LLM_BATCH, len(requests))):
            ident = next(_ids)
            window[ident] = index
            line = json.dumps({"jsonrpc": "2.0", "id": ident, "method": "llm.chat", "params": requests[index]})
            _sock.sendall(line.encode() + b"\n")
        for _ in range(len(window)):
            reply = json.loads(_file.readline() or b"null")
            if reply is None:
                raise ConnectionError("the kernel closed the connection")
            answers[window[reply["id"]]] = reply
    for index, reply in enumerate(answers):
        if "error" in reply:
            raise LLMError(f"llm_batch: prompt {index}: {reply['error'].get('message', 'the call failed')}")
    return [_text(reply["result"]) for reply in answers]


def call_tool(name, args=None, **kwargs):
    if len(_calls) >= _max_calls:
        raise ToolError(f"this program may make at most {_max_calls} tool calls")
    params = dict(args or {}, **kwargs)
    _calls.append(name)
    return _rpc("tool.call", {"name": name, "args": params})["result"]


class _Namespace(types.SimpleNamespace):
    pass


def _tool(name):
    def call(*args, **kwargs):
        if args:
            raise TypeError(f"{name}() takes keyword arguments only, e.g. {name}(path='a.txt')")
        return call_tool(name, kwargs)

    call.__name__ = name
    return call


keel_tools = types.ModuleType("keel_tools")
keel_tools.call_tool = call_tool
keel_tools.ToolError = ToolError
keel_tools.llm = llm
keel_tools.llm_batch = llm_batch
keel_tools.LLMError = LLMError
_globals = {"__name__": "__main__", "call_tool": call_tool, "ToolError": ToolError}
for _name in _req["tools"]:
    parts = [p.replace("-", "_") for p in _name.replace(":", ".").replace("/", ".").split(".")]
    scope = keel_tools
    for part in parts[:-1]:
        if not hasattr(scope, part):
            setattr(scope, part, _Namespace())
        scope = getattr(scope, part)
    setattr(scope, parts[-1], _tool(_name))
for _attr in dir(keel_tools):
    if not _attr.startswith("__"):
        _globals.setdefault(_attr, getattr(keel_tools, _attr))
# The model functions win over a tool of the same name (as in monty and QuickJS).
_globals.update(llm=llm, llm_batch=llm_batch, LLMError=LLMError)
sys.modules["keel_tools"] = keel_tools
_globals.update(_req["inputs"])


def _finish(outcome, hard=False):
    sys.stdout.flush()
    sys.stdout.write("\n" + _marker + json.dumps(outcome, default=repr) + "\n")
    sys.stdout.flush()
    if hard:
        os._exit(0)
    sys.exit(0)


try:
    tree = ast.parse(_req["code"], "<code.exec>")
except SyntaxError as err:
    _finish({"error": {"kind": "syntax", "message": f"{err.msg} (line {err.lineno})"}})
last = None
if tree.body and isinstance(tree.body[-1], ast.Expr):
    last = ast.Expression(tree.body.pop().value)
try:
    exec(compile(tree, "<code.exec>", "exec"), _globals)
    result = eval(compile(last, "<code.exec>", "eval"), _globals) if last is not None else None
except RecursionError as err:
    _finish({"error": {"kind": "recursion", "message": str(err)}})
except MemoryError:
    _finish({"error": {"kind": "memory", "message": "the program ran out of memory"}})
except BaseException as err:  # noqa: BLE001 - every failure is the program's outcome
    text = "".join(traceback.format_exception_only(type(err), err)).strip()
    _finish({"error": {"kind": "runtime", "message": text}})
_finish({"result": result})
