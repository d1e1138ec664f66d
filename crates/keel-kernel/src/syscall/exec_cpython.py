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
sys.modules["keel_tools"] = keel_tools
_globals.update(_req["inputs"])


def _finish(outcome):
    sys.stdout.flush()
    sys.stdout.write("\n" + _marker + json.dumps(outcome, default=repr) + "\n")
    sys.stdout.flush()
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
