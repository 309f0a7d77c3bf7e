"""Models from the Hugging Face Hub, by name: `hf:OWNER/REPO[:QUANT]` or `hf:OWNER/REPO/FILE.gguf`.

    lowbit run -m hf:bartowski/Phi-3.5-mini-instruct-GGUF:Q4_K_M
    lowbit.load("hf:Qwen/Qwen2.5-1.5B-Instruct-GGUF")          # the Q4_K_M file if the repo has one

What a name means (llama.cpp's `-hf REPO[:QUANT]` rule, which users know):
  - QUANT (case-insensitive): the one .gguf file whose name ends in QUANT (after a `-`, `.` or `_`),
    e.g. `Q4_K_M` picks `Phi-3.5-mini-instruct-Q4_K_M.gguf`; no QUANT: Q4_K_M if the repo has it,
    else its only model file; several candidates and no QUANT: an error that lists the quants.
  - FILE.gguf: that file (a path inside the repo).
  - Projector files (`mmproj*`) are never models. A model split into parts (`-00001-of-00003.gguf`)
    is refused: lowbit reads one file (merge it with llama.cpp's gguf-split).
The download is huggingface_hub's (`hf_hub_download`): its cache (HF_HOME), token (HF_TOKEN) and
offline mode (HF_HUB_OFFLINE=1: the cached file, no network) apply, and a file already in the cache
is not fetched again. Every failure is a HubError (a ValueError) with a one-line message; a name
that names no one model file is a BadHubName (one of them).
"""
from __future__ import annotations

import os
import re

PREFIX = "hf:"
DEFAULT_QUANT = "Q4_K_M"
_SPLIT = re.compile(r"-\d{5}-of-\d{5}\.gguf$", re.IGNORECASE)


class HubError(ValueError):
    """A hub model lowbit could not fetch (network, permissions, the cache)."""


class BadHubName(HubError):
    """A hub name that names no one model file (a usage error: the CLI exits 2)."""


def is_hub(spec) -> bool:
    return isinstance(spec, str) and spec.startswith(PREFIX)


def parse(spec: str) -> tuple[str, str | None, str | None]:
    """`hf:OWNER/REPO[:QUANT]` or `hf:OWNER/REPO/FILE.gguf` -> (repo, quant, file)."""
    rest = spec[len(PREFIX):]
    quant = None
    if ":" in rest:
        rest, quant = rest.rsplit(":", 1)
    parts = rest.split("/")
    if len(parts) < 2 or not all(parts) or (quant is not None and (not quant or len(parts) > 2)):
        raise BadHubName(f"{spec!r} is not a hub model name: hf:OWNER/REPO, hf:OWNER/REPO:QUANT or "
                       f"hf:OWNER/REPO/FILE.gguf")
    repo, file = "/".join(parts[:2]), "/".join(parts[2:]) or None
    if file is not None and not file.lower().endswith(".gguf"):
        raise BadHubName(f"{spec!r}: the file in a hub name must be a .gguf file")
    return repo, quant, file


def _quant_of(name: str) -> str:
    """The quant tag a file name ends in: "Phi-3.5-mini-Q4_K_M.gguf" -> "Q4_K_M" ("" if none)."""
    stem = _SPLIT.sub("", os.path.basename(name))
    stem = stem[: -len(".gguf")] if stem.lower().endswith(".gguf") else stem
    m = re.search(r"[-._]((?:[IT]?Q\d[A-Z0-9_]*|BF16|F16|F32|I2_S|MXFP4[A-Z0-9_]*))$", stem, re.IGNORECASE)
    return m.group(1).upper() if m else ""


def pick(files: list[str], repo: str, quant: str | None) -> str:
    """The repo's one model file that `quant` (None: the default rule) names, from its file list."""
    models = [f for f in files if f.lower().endswith(".gguf") and not os.path.basename(f).lower().startswith("mmproj")]
    if not models:
        raise BadHubName(f"hf:{repo} has no .gguf model file")
    if quant is None:
        found = [f for f in models if _quant_of(f) == DEFAULT_QUANT]
        if not found and len(models) == 1:
            found = models
        if not found:
            raise BadHubName(f"hf:{repo} has several models; name one: " + ", ".join(_choices(models, repo)))
    else:
        q = quant.upper()
        found = [f for f in models if _quant_of(f) == q or
                 os.path.basename(f)[:-5].upper().endswith(("-" + q, "." + q, "_" + q))]
        if not found:
            raise BadHubName(f"hf:{repo} has no {quant} file; it has: " + ", ".join(_choices(models, repo)))
    whole = [f for f in found if not _SPLIT.search(f)]
    if not whole:
        raise BadHubName(f"hf:{repo}: {found[0]} is split into parts, which lowbit does not read "
                       f"(merge them with llama.cpp's gguf-split --merge)")
    if len(whole) > 1:
        raise BadHubName(f"hf:{repo}: {len(whole)} files match ({', '.join(whole)}); name one: "
                       f"hf:{repo}/FILE.gguf")
    return whole[0]


def _choices(models: list[str], repo: str) -> list[str]:
    tags = sorted({_quant_of(f) for f in models if _quant_of(f)})
    return [f"hf:{repo}:{t}" for t in tags] or [f"hf:{repo}/{f}" for f in models]


def resolve(spec: str) -> str:
    """The local path of the hub model `spec` names, downloaded into huggingface_hub's cache if
    it is not there yet (with its progress bar)."""
    repo, quant, file = parse(spec)
    try:
        import huggingface_hub as hh
        from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError
    except ImportError:
        raise HubError("hub model names need huggingface_hub (pip install huggingface_hub)") from None
    try:
        if file is None:
            if os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0"):
                raise BadHubName(f"{spec}: offline (HF_HUB_OFFLINE), name the file: hf:{repo}/FILE.gguf")
            file = pick(hh.list_repo_files(repo), repo, quant)
        return hh.hf_hub_download(repo_id=repo, filename=file)
    except HubError:
        raise
    except RepositoryNotFoundError:
        raise HubError(f"hf:{repo}: no such model repository (or it is private: set HF_TOKEN)") from None
    except LocalEntryNotFoundError:
        raise HubError(f"{spec}: not in the local cache and the hub cannot be reached") from None
    except Exception as e:  # HTTP errors, OSErrors, and httpx's connection errors (which are neither)
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise HubError(f"{spec}: the hub could not be reached or refused it: {msg}") from None
