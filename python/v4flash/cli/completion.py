"""``v4flash completion bash|zsh|fish``: a completion script written from the parser itself
(the commands, their options, the choices of those that have some, folders and files where an
option takes a path, the repo ids of the Hugging Face cache for ``--model`` and ``download``),
so it never lags behind the options. No dependency: the shell does the completing."""

from __future__ import annotations

import argparse
import re
from typing import Dict, List, NamedTuple, Optional, Tuple


class Opt(NamedTuple):
    flags: Tuple[str, ...]  # "-m", "--model"
    takes_value: bool
    choices: Tuple[str, ...]
    kind: str  # "model" | "dir" | "file" | "" (another value)
    help: str


class Command(NamedTuple):
    names: Tuple[str, ...]  # the command and its aliases
    help: str
    opts: List[Opt]
    positional: str  # "model" (a repo id), "shell", "" (free text)


def _kind(action: argparse.Action) -> str:
    if action.dest in ("model", "repo"):
        return "model"
    meta = str(action.metavar or "")
    if meta == "DIR":
        return "dir"
    if meta == "FILE":
        return "file"
    return ""


def _first_sentence(text: Optional[str], limit: int = 70) -> str:
    if not text or text is argparse.SUPPRESS:
        return ""
    text = re.sub(r"\s*\[\$V4FLASH_[A-Z_]+[^\]]*\]", "", text)  # the variable, in --help only
    text = re.sub(r"\s+", " ", text.split("; ")[0].split(". ")[0]).strip()
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def commands(p: argparse.ArgumentParser) -> List[Command]:
    """The parser's commands as the scripts need them."""
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    helps = {a.dest: a.help for a in sub._choices_actions}
    names: Dict[int, List[str]] = {}
    parsers: Dict[int, argparse.ArgumentParser] = {}
    for name, q in sub.choices.items():
        names.setdefault(id(q), []).append(name)
        parsers[id(q)] = q
    out = []
    for key, q in parsers.items():
        opts, positional = [], ""
        for a in q._actions:
            if a.help is argparse.SUPPRESS:
                continue
            if not a.option_strings:
                if a.choices:
                    positional = "choices:" + " ".join(map(str, a.choices))
                elif a.dest == "repo":
                    positional = "model"
                continue
            opts.append(
                Opt(
                    tuple(a.option_strings),
                    a.nargs != 0,
                    tuple(map(str, a.choices or ())),
                    _kind(a) if a.nargs != 0 else "",
                    _first_sentence(a.help),
                )
            )
        first = names[key][0]
        out.append(Command(tuple(names[key]), _first_sentence(helps.get(first)), opts, positional))
    return out


# --- bash ---------------------------------------------------------------------------------------

_REPOS_SH = r"""__v4flash_repos() {
    local c="${HF_HUB_CACHE:-${HF_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/huggingface}/hub}" d
    for d in "$c"/models--*; do
        [[ -d "$d" ]] || continue
        d="${d##*/models--}"
        printf '%s\n' "${d/--//}"
    done
}
"""


def bash(cmds: List[Command]) -> str:
    words = " ".join(n for c in cmds for n in c.names)
    lines = [
        '# v4flash completion for bash: eval "$(v4flash completion bash)" (e.g. in ~/.bashrc)',
        _REPOS_SH,
        "_v4flash() {",
        '    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"',
        '    local cmd="" i',
        "    for ((i = 1; i < COMP_CWORD; i++)); do",
        '        case "${COMP_WORDS[i]}" in -*) ;; *) cmd="${COMP_WORDS[i]}"; break ;; esac',
        "    done",
        '    if [[ -z "$cmd" ]]; then',
        f'        COMPREPLY=($(compgen -W "{words} --help --version" -- "$cur"))',
        "        return",
        "    fi",
        '    case "$cmd" in',
    ]
    for c in cmds:
        lines.append(f"    {'|'.join(c.names)})")
        lines.append('        case "$prev" in')
        for o in c.opts:
            if not o.takes_value:
                continue
            if o.choices:
                what = f'COMPREPLY=($(compgen -W "{" ".join(o.choices)}" -- "$cur"))'
            elif o.kind == "model":
                what = (
                    "compopt -o filenames 2>/dev/null; "
                    'COMPREPLY=($(compgen -d -- "$cur") $(compgen -W "$(__v4flash_repos)" -- '
                    '"$cur"))'
                )
            elif o.kind == "dir":
                what = 'compopt -o filenames 2>/dev/null; COMPREPLY=($(compgen -d -- "$cur"))'
            elif o.kind == "file":
                what = 'compopt -o filenames 2>/dev/null; COMPREPLY=($(compgen -f -- "$cur"))'
            else:
                what = "COMPREPLY=()"  # a number, a text: nothing to offer
            lines.append(f"            {'|'.join(o.flags)}) {what}; return ;;")
        lines.append("        esac")
        flags = " ".join(f for o in c.opts for f in o.flags)
        if c.positional.startswith("choices:"):
            words = f'compgen -W "{c.positional[8:]}" -- "$cur"'
        elif c.positional == "model":
            words = 'compgen -W "$(__v4flash_repos)" -- "$cur"'
        else:
            words = ":"  # a prompt: nothing to offer
        lines.append(
            f'        if [[ "$cur" == -* ]]; then COMPREPLY=($(compgen -W "{flags}" -- "$cur"))'
        )
        lines.append(f"        else COMPREPLY=($({words})); fi ;;")
    lines += ["    esac", "}", "complete -F _v4flash v4flash", ""]
    return "\n".join(lines)


# --- zsh ----------------------------------------------------------------------------------------


def _zq(s: str) -> str:
    """Inside single quotes, and inside _arguments' [description]."""
    s = s.replace("\\", "\\\\").replace("[", "\\[").replace("]", "\\]").replace(":", "\\:")
    return s.replace("'", "'\\''")


def _zsh_action(o: Opt) -> str:
    if not o.takes_value:
        return ""
    if o.choices:
        return f":value:({' '.join(o.choices)})"
    if o.kind == "model":
        return ":model:_v4flash_models"
    if o.kind == "dir":
        return ":folder:_files -/"
    if o.kind == "file":
        return ":file:_files"
    return ":value: "


def zsh(cmds: List[Command]) -> str:
    lines = [
        "#compdef v4flash",
        '# v4flash completion for zsh: eval "$(v4flash completion zsh)" (e.g. in ~/.zshrc,',
        "# after compinit), or save it as _v4flash in a folder of $fpath",
        "_v4flash_models() {",
        "    local c=${HF_HUB_CACHE:-${HF_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/huggingface}/hub}",
        "    local -a repos",
        '    repos=(${${${(f)"$(print -l $c/models--*(N/:t))"}#models--}/--//})',
        "    _alternative 'folders:folder:_files -/' \"repos:repo id:(${repos[*]})\"",
        "}",
        "_v4flash() {",
        "    local curcontext=$curcontext state line",
        "    local -a cmds",
        "    cmds=(",
    ]
    for c in cmds:
        for n in c.names:
            lines.append(f"        '{_zq(n)}:{_zq(c.help)}'")
    lines += [
        "    )",
        "    _arguments -C '(- *)--version[show the version]' '(- *)'{-h,--help}'[show help]' \\",
        "        '1:command:->cmd' '*::arg:->args'",
        "    case $state in",
        "    cmd) _describe -t commands command cmds ;;",
        "    args)",
        "        case $words[1] in",
    ]
    for c in cmds:
        specs = []
        for o in c.opts:
            if o.flags == ("-h", "--help"):
                continue
            desc = f"[{_zq(o.help)}]" + _zsh_action(o)
            if len(o.flags) == 1:
                specs.append(f"'{o.flags[0]}{desc}'")
            else:
                excl = " ".join(o.flags)
                specs.append(f"'({excl})'{{{','.join(o.flags)}}}'{desc}'")
        if c.positional.startswith("choices:"):
            specs.append(f"'1:shell:({c.positional[8:]})'")
        elif c.positional == "model":
            specs.append("'1:repo id:_v4flash_models'")
        elif c.names[0] == "run":
            specs.append("'*:prompt: '")
        body = " \\\n                ".join(specs) if specs else "''"
        lines.append(f"        {'|'.join(c.names)})")
        lines.append(f"            _arguments {body} ;;")
    lines += [
        "        esac ;;",
        "    esac",
        "}",
        'if [[ "${zsh_eval_context[-1]}" == loadautofunc ]]; then',
        '    _v4flash "$@"',
        "else",
        "    compdef _v4flash v4flash",
        "fi",
        "",
    ]
    return "\n".join(lines)


# --- fish ---------------------------------------------------------------------------------------


def _fq(s: str) -> str:
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def fish(cmds: List[Command]) -> str:
    names = " ".join(n for c in cmds for n in c.names)
    lines = [
        "# v4flash completion for fish:",
        "# v4flash completion fish > ~/.config/fish/completions/v4flash.fish",
        "function __v4flash_repos",
        "    set -l c $HF_HUB_CACHE",
        '    if test -z "$c"',
        '        if test -n "$HF_HOME"',
        "            set c $HF_HOME/hub",
        '        else if test -n "$XDG_CACHE_HOME"',
        "            set c $XDG_CACHE_HOME/huggingface/hub",
        "        else",
        "            set c $HOME/.cache/huggingface/hub",
        "        end",
        "    end",
        "    for d in $c/models--*",
        "        test -d $d; and string replace -r '^models--' '' (basename $d) \\",
        "            | string replace -- '--' '/'",
        "    end",
        "end",
        "complete -c v4flash -f",
        "complete -c v4flash -n __fish_use_subcommand -l version -d 'show the version'",
    ]
    for c in cmds:
        for n in c.names:
            lines.append(f"complete -c v4flash -n __fish_use_subcommand -a {n} -d {_fq(c.help)}")
    for c in cmds:
        cond = f"'__fish_seen_subcommand_from {' '.join(c.names)}'"
        for o in c.opts:
            parts = [f"complete -c v4flash -n {cond}"]
            for f in o.flags:
                parts.append(f"-l {f[2:]}" if f.startswith("--") else f"-s {f[1:]}")
            if o.takes_value:  # -x: a value, no file names unless -F
                if o.choices:
                    parts.append(f"-x -a {_fq(' '.join(o.choices))}")
                elif o.kind == "model":
                    parts.append("-x -a '(__fish_complete_directories; __v4flash_repos)'")
                elif o.kind == "dir":
                    parts.append("-x -a '(__fish_complete_directories)'")
                elif o.kind == "file":
                    parts.append("-r -F")
                else:
                    parts.append("-x")
            if o.help:
                parts.append(f"-d {_fq(o.help)}")
            lines.append(" ".join(parts))
        if c.positional.startswith("choices:"):
            lines.append(f"complete -c v4flash -n {cond} -a {_fq(c.positional[8:])}")
        elif c.positional == "model":
            lines.append(f"complete -c v4flash -n {cond} -a '(__v4flash_repos)'")
    lines.append(f"# commands: {names}")
    lines.append("")
    return "\n".join(lines)


def script(p: argparse.ArgumentParser, shell: str) -> str:
    return {"bash": bash, "zsh": zsh, "fish": fish}[shell](commands(p))


def cmd_completion(args: argparse.Namespace, p: argparse.ArgumentParser) -> int:
    print(script(p, args.shell), end="")
    return 0
