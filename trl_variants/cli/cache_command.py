"""``trl-variants cache {list,clear}``: the offline pass's cache entries (their status, size and model), and their
removal."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time

from .help import COMMAND_HELP

_ENTRY = re.compile(r"[0-9a-f]{20}")  # an entry's directory name: its cache key (presample.cache.cache_key)


def cache_entries(root) -> list:
    """The offline-pass cache entries under ``root``: the directories named by a cache key (nothing else there is
    listed or removed), oldest first."""
    from pathlib import Path

    root = Path(root)
    if not root.is_dir():
        return []
    entries = [p for p in root.iterdir() if p.is_dir() and not p.is_symlink() and _ENTRY.fullmatch(p.name)]
    return sorted(entries, key=lambda p: p.stat().st_mtime)


def _entry_info(entry) -> dict:
    """What ``cache list`` shows of one entry, read from its ``options.json`` and its dataset's info (no data
    loaded)."""
    size, mtime = 0, entry.stat().st_mtime
    for f in entry.rglob("*"):
        if f.is_file() and not f.is_symlink():
            stat = f.stat()
            size, mtime = size + stat.st_size, max(mtime, stat.st_mtime)
    try:
        options = json.loads((entry / "options.json").read_text())
    except (OSError, ValueError):
        options = {}
    options = options if isinstance(options, dict) else {}
    shards = len(list(entry.glob("shard-*.json")))
    if (entry / "dataset" / "state.json").exists():
        status = "complete"
    else:
        status = f"{shards}/{options.get('shards', '?')} shards"
    model = ""
    try:
        description = json.loads((entry / "dataset" / "dataset_info.json").read_text())["description"]
        from ..presample import METADATA_KEY

        model = json.loads(description)[METADATA_KEY]["model"]["name"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    key_options = options.get("options")
    samples = key_options.get("num_samples", "?") if isinstance(key_options, dict) else "?"
    return {"key": entry.name, "status": status, "rows": options.get("rows", "?"), "samples": samples, "size": size,
            "modified": time.strftime("%Y-%m-%d %H:%M", time.localtime(mtime)), "model": model}


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


def _entries_text(n: int) -> str:
    return f"{n} entry" if n == 1 else f"{n} entries"


def cache_main(argv: list[str]) -> None:
    from pathlib import Path

    from ..presample.cache import default_cache_dir

    parser = argparse.ArgumentParser(prog="trl-variants cache", description=COMMAND_HELP["cache"])
    sub = parser.add_subparsers(dest="action", metavar="{list,clear}", required=True)
    where = ("The cache directory (a trainer's presample_cache_dir, presample's --cache_dir); default: "
             "$TRL_VARIANTS_CACHE or ~/.cache/trl_variants/presample.")
    show = sub.add_parser("list", help="List the entries: key, status, rows, samples per prompt, size, last "
                                       "write, model.", description="List the offline-pass cache entries.")
    show.add_argument("--cache_dir", default=None, help=where)
    clear = sub.add_parser("clear", help="Remove entries (all, or the KEYs given); asks first unless --yes.",
                           description="Remove offline-pass cache entries (the directories named by a cache key; "
                                       "nothing else in the directory). Do not run it while a pass is writing.")
    clear.add_argument("keys", nargs="*", metavar="KEY", help="Entries to remove (default: all), as `list` shows.")
    clear.add_argument("--cache_dir", default=None, help=where)
    clear.add_argument("--yes", "-y", action="store_true", help="Remove without asking.")
    args = parser.parse_args(argv)
    root = Path(args.cache_dir).expanduser() if args.cache_dir else default_cache_dir()
    entries = cache_entries(root)
    if args.action == "list":
        infos = [_entry_info(e) for e in entries]
        total = sum(i["size"] for i in infos)
        print(f"offline-pass cache {root}: {_entries_text(len(infos))}, {_size(total)}"
              + ("" if root.is_dir() else " (the directory does not exist)"))
        if infos:
            print(f"{'KEY':<20}  {'STATUS':<12}  {'ROWS':>6}  {'SAMPLES':>7}  {'SIZE':>9}  {'MODIFIED':<16}  MODEL")
            for i in infos:
                print(f"{i['key']:<20}  {i['status']:<12}  {i['rows']!s:>6}  {i['samples']!s:>7}  "
                      f"{_size(i['size']):>9}  {i['modified']:<16}  {i['model']}")
        return
    if args.keys:
        by_key = {e.name: e for e in entries}
        unknown = [k for k in args.keys if k not in by_key]
        if unknown:
            raise SystemExit(f"trl-variants cache clear: no entry {', '.join(map(repr, unknown))} in {root} "
                             "(`trl-variants cache list` shows the keys); nothing removed")
        entries = [by_key[k] for k in dict.fromkeys(args.keys)]
    if not entries:
        print(f"offline-pass cache {root}: nothing to remove")
        return
    size = sum(_entry_info(e)["size"] for e in entries)
    what = f"{_entries_text(len(entries))} ({_size(size)}) from {root}"
    if not args.yes:
        if not (sys.stdin is not None and sys.stdin.isatty()):
            print(f"trl-variants cache clear: would remove {what}; pass --yes to remove them (nothing removed)",
                  file=sys.stderr)
            raise SystemExit(1)
        if input(f"Remove {what}? [y/N] ").strip().lower() not in ("y", "yes"):
            print("nothing removed")
            return
    for entry in entries:
        shutil.rmtree(entry)
    print(f"removed {what}")

