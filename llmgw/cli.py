"""`llmgw ctl …`: the console's REST API from a shell.

    llmgw ctl model list [--json]
    llmgw ctl model context NAME [--tokens N] [--slots S] [--max-output M] [--message WHY]
                                 [--dry-run] [--wait] [--json]
    llmgw ctl change show ID [--json]
    llmgw ctl change rollback ID [--message WHY] [--wait] [--json]

The server is LLMGW_URL (default http://127.0.0.1:8000), the credentials LLMGW_TOKEN (made with
`python manage.py create_api_token USERNAME`). Exit codes: 0 done, 2 usage, 3 refused (the
server said no: 400, 401, 403, 404, 409), 4 the rollout failed, 5 the server could not be
reached, 1 anything else (a server error).

It needs no Django: only httpx and rich.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import httpx
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

OK, ERROR, USAGE, REFUSED, FAILED, UNREACHABLE = 0, 1, 2, 3, 4, 5
DEFAULT_URL = "http://127.0.0.1:8000"
ACTIVE = ("queued", "running")
RESTART = {"surge": "new before old", "in_place": "in place", "none": "—"}

out = Console(highlight=False, soft_wrap=False)
err = Console(stderr=True, highlight=False)


class Exit(Exception):
    def __init__(self, code: int, message: str = ""):
        super().__init__(message)
        self.code = code
        self.message = message


# ----------------------------------------------------------------------------- the API


class Api:
    def __init__(self, url: str, token: str, *, timeout: float = 30.0):
        self.url = url.rstrip("/")
        headers = {"Accept": "application/json", "X-LLMGW-Source": "cli"}
        if token:
            headers["Authorization"] = f"Token {token}"
        self.client = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        try:
            r = self.client.request(method, path, json=body)
        except (httpx.TransportError, httpx.UnsupportedProtocol, httpx.InvalidURL) as e:
            raise Exit(
                UNREACHABLE,
                f"cannot reach the llmgw console at {self.url} (LLMGW_URL): {e or type(e).__name__}",
            ) from None
        try:
            data = r.json()
        except ValueError:
            if r.status_code >= 500:
                raise Exit(ERROR, f"the server failed ({r.status_code}) at {self.url}{path}") from None
            raise Exit(
                ERROR, f"{self.url}{path} answered {r.status_code} without JSON: is LLMGW_URL the llmgw console?"
            ) from None
        return r.status_code, data

    def get(self, path: str) -> dict:
        status, data = self.call("GET", path)
        if status != 200:
            raise refused(status, data)
        return data


def refused(status: int, data) -> Exit:
    """The server said no: its message, the field at fault, the change in the way."""
    if status >= 500:
        return Exit(ERROR, f"the server failed ({status})")
    detail = data.get("detail") if isinstance(data, dict) else None
    message = str(detail or data)
    if status == 401:
        message += " (set LLMGW_TOKEN: python manage.py create_api_token USERNAME)"
    if isinstance(data, dict) and data.get("field") and status == 400:
        message = f"{message} [{data['field']}]"
    if status == 409 and isinstance(data, dict) and data.get("url"):
        message += f"\n  the change in the way: {data['url']}  (llmgw ctl change show {data.get('change_id')})"
    return Exit(REFUSED, message)


# ----------------------------------------------------------------------------- rendering


def _flag_value(args: list[str], flag: str) -> str | None:
    value = None
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith(flag + "="):
            value = a[len(flag) + 1 :]
    return value


def _args_diff(p: dict) -> Text:
    before, after = p.get("args_before") or [], p.get("args_after") or []
    flags = p.get("changed_flags") or []
    if not flags:
        return Text("unchanged", style="dim")
    text = Text()
    for i, flag in enumerate(flags):
        if i:
            text.append("\n")
        old, new = _flag_value(before, flag), _flag_value(after, flag)
        text.append(f"{flag} ")
        text.append(old if old is not None else "(absent)", style="red")
        text.append(" → ")
        text.append(new if new is not None else "(absent)", style="green")
    return text


def _memory(p: dict) -> Text:
    before, after = p.get("memory_before"), p.get("memory_after")
    if not before and not after:
        return Text("not checked", style="dim")
    text = Text((before or {}).get("text") or "?")
    text.append(" → ")
    fits = (after or {}).get("fits")
    text.append((after or {}).get("text") or "?", style="red" if fits is False else "green" if fits else "")
    return text


def _numbers(before, after) -> str:
    return f"{before} → {after}" if before != after else f"{after} (unchanged)"


def render_plan(plan: dict, console: Console = out, *, refusal: bool = True) -> None:
    name = escape(str(plan.get("model", "?")))
    answer = _numbers(plan.get("max_output_before"), plan.get("max_output_after"))
    if plan.get("output_only"):
        console.print(f"[bold]{name}[/]: longest answer {answer}; only the catalog changes, no replica restarts")
    else:
        trained = f" (trained for {plan['trained']})" if plan.get("trained") else ""
        slots = f", {plan['slots']} slots" if plan.get("slots") else ""
        console.print(
            f"[bold]{name}[/]: context {_numbers(plan.get('context_before'), plan.get('context_after'))} tokens"
            f"{slots}{trained}; longest answer {answer}"
        )
    profiles = plan.get("profiles") or []
    if profiles:
        table = Table(show_lines=True)
        for column in ("profile", "engine", "arguments (before → after)", "memory (before → after)", "restart"):
            table.add_column(column)
        for p in profiles:
            restart = RESTART.get(p.get("restart"), p.get("restart") or "")
            table.add_row(Text(p.get("profile", "")), Text(p.get("engine", "")), _args_diff(p), _memory(p), restart)
        console.print(table)
    notes = [Text(f"  note: {n}") for n in plan.get("notes") or []]
    notes += [Text(f"  note: {p['profile']}: {p['note']}") for p in profiles if p.get("note")]
    notes += [Text(f"  {p['profile']}: {p['refusal']['message']}", style="red") for p in profiles if p.get("refusal")]
    for note in notes:
        console.print(note)
    if refusal and plan.get("refusal"):
        r = plan["refusal"]
        console.print(Text(f"refused ({r.get('field')}): {r.get('message')}", style="red"))


def _progress_of(change: dict) -> tuple[int, int]:
    progress = change.get("progress") or {}
    return int(progress.get("done") or 0), int(progress.get("total") or 0)


def render_change(change: dict, console: Console = out) -> None:
    before, after = change.get("before") or {}, change.get("after") or {}
    state = change.get("state", "?")
    style = {"succeeded": "green", "failed": "red", "refused": "red", "rolled_back": "yellow"}.get(state, "cyan")
    console.print(
        f"[bold]change {change.get('id')}[/] of {escape(str(change.get('model')))}: {change.get('kind')}, [{style}]{state}[/]"
    )
    console.print(Text(f"  by {change.get('user') or '?'} via {change.get('source')}, {change.get('created_at')}"))
    if change.get("message"):
        console.print(Text(f"  why: {change['message']}"))
    if after:
        console.print(
            f"  context {_numbers(before.get('context_length'), after.get('context_length'))}, "
            f"longest answer {_numbers(before.get('max_output'), after.get('max_output'))}"
        )
    if change.get("rollback_of"):
        console.print(f"  rolls back change {change['rollback_of']}")
    done, total = _progress_of(change)
    if total:
        console.print(f"  replicas: {done} of {total} restarted")
    steps = change.get("steps") or []
    if steps:
        table = Table()
        for column in ("#", "profile", "node", "policy", "state", "detail"):
            table.add_column(column)
        for s in steps:
            table.add_row(*(Text(str(v or "")) for v in (s.get("position"), s.get("profile"), s.get("node"), s.get("policy"), s.get("state"), s.get("detail"))))
        console.print(table)
    if change.get("error"):
        console.print(Text(f"  error: {change['error']}", style="red"))
    if change.get("url"):
        console.print(Text(f"  {change['url']}"))


def print_json(data) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
    sys.stdout.flush()


# ----------------------------------------------------------------------------- commands


def wait_for(api: Api, change: dict, *, interval: float, as_json: bool) -> int:
    """Follow a change until it ends, with a progress bar (replica k of n); its exit code."""
    change_id = change["id"]
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    with Progress(*columns, console=err, transient=False) as progress:
        task = progress.add_task(f"change {change_id}: {change.get('state')}", total=None)
        while change.get("state") in ACTIVE:
            done, total = _progress_of(change)
            progress.update(
                task,
                description=f"change {change_id}: {change.get('state')}, replica {min(done + 1, total) if total else '-'} of {total or '?'}",
                completed=done,
                total=total or None,
            )
            time.sleep(interval)
            change = api.get(f"/api/v1/changes/{change_id}")
        done, total = _progress_of(change)
        progress.update(task, description=f"change {change_id}: {change.get('state')}", completed=done, total=total or 1)
    if as_json:
        print_json(change)
    else:
        render_change(change)
    if change.get("state") == "succeeded":
        return OK
    raise Exit(FAILED, f"change {change_id} {change.get('state')}: {change.get('error') or 'see its page'}"
               + ("\n  roll it back: llmgw ctl change rollback " + str(change_id) if change.get("state") == "failed" else ""))


def _after_change(api: Api, status: int, data: dict, args) -> int:
    """Print what a change request answered; follow it with --wait."""
    if status == 200:  # a dry run, or a longest-answer change that is already done
        if args.json:
            print_json(data)
        else:
            render_plan(data.get("plan") or {})
            if data.get("change"):
                render_change(data["change"])
            elif data.get("dry_run"):
                out.print("dry run: nothing was changed")
        return OK
    if status == 202:
        if args.wait:
            if not args.json:
                render_plan(data.get("plan") or {})
            return wait_for(api, data, interval=args.interval, as_json=args.json)
        if args.json:
            print_json(data)
        else:
            render_plan(data.get("plan") or {})
            out.print(f"change {data['id']} {data['state']}: {data.get('url')}")
            out.print(f"follow it: llmgw ctl change show {data['id']}  (or --wait)")
        return OK
    if args.json:
        print_json(data)
    elif status == 400 and isinstance(data, dict) and (data.get("plan") or {}).get("profiles"):
        render_plan(data["plan"], err, refusal=False)  # which profile does not fit, and by how much
    raise refused(status, data)


def cmd_model_context(api: Api, args) -> int:
    body = {"message": args.message or "", "dry_run": bool(args.dry_run)}
    for key in ("tokens", "slots", "max_output"):
        value = getattr(args, key)
        if value is not None:
            body[key] = value
    status, data = api.call("POST", f"/api/v1/models/{args.name}/context", body)
    return _after_change(api, status, data, args)


def cmd_model_list(api: Api, args) -> int:
    rows, path = [], "/api/v1/models"
    while path:
        page = api.get(path)
        rows += page.get("results") or []
        nxt = page.get("next")
        path = nxt[len(api.url) :] if nxt and nxt.startswith(api.url) else nxt
    if args.json:
        print_json(rows)
        return OK
    table = Table()
    for column in ("model", "context", "longest answer", "profiles", "replicas ready", "declared", "change"):
        table.add_column(column)
    for m in rows:
        current = m.get("current_change")
        table.add_row(
            Text(m.get("name", "")),
            str(m.get("context_length")),
            str(m.get("max_output") or "no limit"),
            str(m.get("profiles_count")),
            f"{m.get('replicas_ready')} of {m.get('replicas_total')}",
            "yes" if m.get("declared") else "",
            f"{current['id']} {current['state']}" if current else "",
        )
    out.print(table)
    return OK


def cmd_change_show(api: Api, args) -> int:
    change = api.get(f"/api/v1/changes/{args.id}")
    if args.json:
        print_json(change)
    else:
        render_change(change)
    return OK


def cmd_change_rollback(api: Api, args) -> int:
    status, data = api.call("POST", f"/api/v1/changes/{args.id}/rollback", {"message": args.message or ""})
    return _after_change(api, status, data, args)


# ----------------------------------------------------------------------------- arguments


def _positive_float(value: str) -> float:
    f = float(value)
    if not f > 0:
        raise argparse.ArgumentTypeError("a number of seconds above 0")
    return f


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="llmgw", description="The llmgw console from a shell (LLMGW_URL, LLMGW_TOKEN).")
    top = p.add_subparsers(dest="top", required=True, metavar="ctl")
    ctl = top.add_parser("ctl", help="control the catalog").add_subparsers(dest="noun", required=True)

    model = ctl.add_parser("model", help="served models").add_subparsers(dest="verb", required=True)
    ls = model.add_parser("list", help="the served models")
    ls.add_argument("--json", action="store_true", help="print the API's JSON")
    ls.set_defaults(run=cmd_model_list)

    ctx = model.add_parser("context", help="change a model's context and/or longest answer")
    ctx.add_argument("name")
    ctx.add_argument("--tokens", type=int, help="tokens one request may use")
    ctx.add_argument("--slots", type=int, help="llama.cpp requests at once (1-64; default: keep)")
    ctx.add_argument("--max-output", dest="max_output", type=int, help="longest answer; alone: change only that")
    ctx.add_argument("--message", "-m", default="", help="why (kept in the audit history)")
    ctx.add_argument("--dry-run", action="store_true", help="show the plan, change nothing")
    ctx.add_argument("--wait", action="store_true", help="follow the rollout until it ends")
    ctx.add_argument("--json", action="store_true", help="print the API's JSON")
    ctx.set_defaults(run=cmd_model_context)

    change = ctl.add_parser("change", help="context changes").add_subparsers(dest="verb", required=True)
    show = change.add_parser("show", help="a change and its rollout")
    show.add_argument("id", type=int)
    show.add_argument("--json", action="store_true")
    show.set_defaults(run=cmd_change_show)

    back = change.add_parser("rollback", help="a new change back to what a change changed from")
    back.add_argument("id", type=int)
    back.add_argument("--message", "-m", default="")
    back.add_argument("--wait", action="store_true")
    back.add_argument("--json", action="store_true")
    back.set_defaults(run=cmd_change_rollback)

    try:
        interval = _positive_float(os.environ.get("LLMGW_POLL_INTERVAL") or "1")
    except (ValueError, argparse.ArgumentTypeError):
        interval = 1.0
    for sub in (ctx, back):
        sub.add_argument("--interval", type=_positive_float, default=interval, help="seconds between polls with --wait")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)  # exits 2 on a usage error
    api = Api(os.environ.get("LLMGW_URL") or DEFAULT_URL, os.environ.get("LLMGW_TOKEN", ""))
    try:
        return args.run(api, args)
    except Exit as e:
        if e.message:
            err.print(Text(e.message, style="red" if e.code != OK else ""))
        return e.code
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
