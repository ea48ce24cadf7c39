"""What each stable diagnostic code means and what to do about it.

The one source for ``sensorium explain CODE`` and for ``docs/troubleshooting.md``
(generated from this table; a test keeps the page and the table in step, and checks
that every code of both published vocabularies has an entry here).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# What a caller should do with a reply carrying the code.
Remedy = Literal["retry", "fix", "give-up", "operator"]


@dataclass(frozen=True, slots=True)
class Explanation:
    meaning: str
    causes: tuple[str, ...]
    action: str
    remedy: Remedy


def _e(meaning: str, causes: tuple[str, ...], action: str, remedy: Remedy) -> Explanation:
    return Explanation(meaning, causes, action, remedy)


EXPLANATIONS: dict[str, Explanation] = {
    # --- sensorium-os-error-codes.v1: the action-class contract ---
    "action-catalog-unauthorized": _e(
        "The connector's action catalog is not signed by a trusted key, or its signature "
        "does not match the catalog's current content.",
        (
            "a catalog file or drop-in was edited after `sensorium catalog sign`",
            "the catalog was signed but the connector was not restarted (hash-mismatch)",
            "the sidecar was signed by a key that is not in keys/operators/",
        ),
        "Run `sensorium catalog validate`, then `sensorium catalog sign` and "
        "`sensorium restart connector`. `sensorium ledger` shows the reason per action.",
        "operator",
    ),
    "action-not-allowlisted": _e(
        "The directive names an action the signed catalog does not declare.",
        ("a typo in the action id", "the action lives in a drop-in that is not loaded yet"),
        "List what exists with `sensorium actions`; fix the id or declare the action.",
        "fix",
    ),
    "action-timeout": _e(
        "The action ran past its timeout and was killed with its whole process tree.",
        ("the work needs more time than `timeout_ms` allows", "the program waits on input"),
        "Raise the directive's `timing.timeout_ms` within the declaration's maximum, or run "
        "the action deferred (`--async`).",
        "fix",
    ),
    "directive-missing": _e(
        "A request that must carry a directive carried none.",
        ("a hand-written client left out the `directive` object",),
        "Send a `sensorium-directive.v1` under `directive` (see docs/wire-protocol.md).",
        "fix",
    ),
    "parameters-invalid": _e(
        "The directive's parameters do not satisfy the action's parameter schema.",
        ("a missing required parameter", "a value of the wrong type or out of its bounds"),
        "`sensorium actions --json` shows each action's parameter schema; the error's "
        "`path` names the failing parameter.",
        "fix",
    ),
    "parameters-schema-invalid": _e(
        "The action's declared parameter schema is itself not a valid JSON Schema.",
        ("a catalog entry with a malformed `parameters_schema`",),
        "Fix the declaration and run `sensorium catalog validate`.",
        "operator",
    ),
    "result-pointer-missing": _e(
        "A result pointer the declaration promises was absent from the action's output.",
        ("the program's JSON output changed shape", "the program failed before printing"),
        "Compare the program's stdout with the declaration's `result_pointers`.",
        "operator",
    ),
    "result-schema-invalid": _e(
        "The action's output does not satisfy its declared result schema.",
        ("the program printed something other than the declared JSON",),
        "Check the outcome's stdout against the declaration's `result_schema`.",
        "operator",
    ),
    "script-hash-mismatch": _e(
        "The script on disk is not the one whose digest the catalog pinned.",
        ("the script was edited after the catalog was signed",),
        "Re-pin the digest in the declaration, re-sign the catalog, restart the connector.",
        "operator",
    ),
    "script-not-executable": _e(
        "The declared script or interpreter cannot be executed as declared.",
        ("the file is missing or lacks the execute bit", "a writer other than its owner"),
        "Check the path, owner and mode the error names.",
        "operator",
    ),
    "working-directory-forbidden": _e(
        "A working directory or script root lies outside what the action may use.",
        ("a path outside the granted roots", "a root another user can write to"),
        "Use a path inside the action's declared roots, owned by the node's user.",
        "fix",
    ),
    # --- sensorium-runtime-error-codes.v1: transport and runtime conditions ---
    "action-not-enabled": _e(
        "The action is declared but not enabled on this node right now.",
        (
            "the runtime cannot enforce its class here (`unsupported_by_runtime`)",
            "the catalog is unauthorized or the connector is restarting",
        ),
        "`sensorium ledger ACTION` says why per plane; `sensorium doctor` says what this "
        "machine lacks.",
        "operator",
    ),
    "signer-domain-refused": _e(
        "The action asked its scoped signer grant for a signature under a domain its "
        "declaration does not allow; nothing was signed and the refusal is audited.",
        ("the script signs under another domain than the catalog's signing.allowed_domains",),
        "Add the domain to the declaration's signing.allowed_domains (and re-sign the "
        "catalog), or fix the script.",
        "operator",
    ),
    "signer-count-exhausted": _e(
        "The action asked for more signatures than its declaration's "
        "signing.max_signatures; nothing more was signed and the refusal is audited.",
        ("the script signs more than once", "max_signatures is lower than the work needs"),
        "Raise signing.max_signatures in the declaration, or sign once.",
        "operator",
    ),
    "signer-grant-ended": _e(
        "The signer grant's directive has ended (or passed its deadline): its grant is "
        "revoked and nothing more is signed under it. The attempt is audited.",
        ("a token replayed after its directive finished", "a process outliving its action"),
        "Nothing to retry: each directive gets its own grant.",
        "give-up",
    ),
    "signer-grant-unknown": _e(
        "A signing request carried a token no live grant was issued with, or another "
        "directive's token; nothing was signed and the attempt is audited.",
        ("a forged or altered token", "a token taken from another directive"),
        "Treat it as an attack on the signer: the audit's signer events name the channel.",
        "give-up",
    ),
    "signer-unavailable": _e(
        "`sensorium-sign` has no grant to use: this process was not started with one, or "
        "the signer closed it.",
        (
            "the action's declaration has no signing block",
            "the helper ran outside the action",
            "core stopped while the action ran",
        ),
        "Declare `signing` for the action (docs/actions.md) and call the helper from its script.",
        "operator",
    ),
    "catalog-invalid": _e(
        "A catalog file does not validate; the connector keeps its last good catalog.",
        ("a syntax or schema error in the catalog or a drop-in",),
        "`sensorium catalog validate` lists every error with its path.",
        "operator",
    ),
    "catalog-stale": _e(
        "Core's view of the catalog is older than the connector's.",
        ("the catalog was reloaded while the directive was in flight",),
        "Retry; the next attempt uses the new catalog.",
        "retry",
    ),
    "connector-unavailable": _e(
        "Core could not reach the connector; the directive provably did not start.",
        ("the connector is restarting", "the connector crashed"),
        "Retry after `retry_after_ms`; `sensorium status` shows the connector's state.",
        "retry",
    ),
    "core-unavailable": _e(
        "The client could not reach core.",
        ("the node is not running", "the wrong state directory or endpoint"),
        "`sensorium status`; start the node with `sensorium up` or its systemd units.",
        "retry",
    ),
    "deadline-exceeded": _e(
        "The directive's deadline passed before it could be served.",
        ("a `deadline_at` in the past or too close", "a long queue in front of it"),
        "Send a later deadline, or retry with a new directive.",
        "fix",
    ),
    "deferred-not-accepted": _e(
        "The connector refused to take the directive as a deferred job.",
        ("the job store is full", "the action does not allow deferred execution"),
        "Run it synchronously, or retry when fewer jobs are open (`sensorium ops`).",
        "retry",
    ),
    "envelope-degraded": _e(
        "Information: the action ran with less than its class envelope, as its signed "
        "declaration's `allow_fallback` allows; the message lists what was given up.",
        ("a deny glob the kernel cannot enforce here, opted out by `allow_fallback`",),
        "Nothing, if that was intended; otherwise remove the `allow_fallback` entry and "
        "the action is refused instead of run with less.",
        "operator",
    ),
    "envelope-violation": _e(
        "The action tried to leave its envelope or exceeded a cap; its effect was not kept.",
        ("a write outside the declared roots", "more files or bytes than the caps allow"),
        "The outcome's diagnostics name the cap; raise it in the declaration or fix the program.",
        "give-up",
    ),
    "execution-mode-unsupported": _e(
        "The action cannot run in the asked mode (sync or async).",
        ("a long action declared async-only", "a degraded action asked to run deferred"),
        "`sensorium actions` shows each action's modes; ask for the one it supports.",
        "fix",
    ),
    "flow-invalid": _e(
        "The flow definition does not validate.",
        ("an unknown step reference", "a template that does not render"),
        "The error's `path` names the failing part of the flow.",
        "fix",
    ),
    "flow-step-failed": _e(
        "A step of the flow ended failed, so the flow stopped.",
        ("the step's action failed",),
        "`sensorium flow status FLOW_ID` shows the failing step and its outcome.",
        "give-up",
    ),
    "flow-unknown": _e(
        "No flow has that id on this node.",
        ("a typo", "the flow's record was pruned"),
        "Check the id the run returned.",
        "fix",
    ),
    "consent-required": _e(
        "The action is more sensitive than this node lets a caller trigger without "
        "consent, and the directive did not consent to it; nothing ran.",
        (
            "an action declared (or composed to be) above consent.max_sensitivity_without_consent",
            "a directive without consent/sensitivity, or with a laxer class",
        ),
        "Send the directive with `consent/sensitivity` naming the class the error names "
        "(`sensorium invoke --consent CLASS`), or raise "
        "`consent.max_sensitivity_without_consent` in config/node.json.",
        "fix",
    ),
    "grant-denied": _e(
        "The client key is not granted this action or read path.",
        ("a CURVE key added without the group or action it now asks for",),
        "`sensorium keys client list`; add the grant with `sensorium keys client add`.",
        "operator",
    ),
    "idempotency-conflict": _e(
        "The idempotency key was used before by this caller with other parameters.",
        ("a client reused a key for a different request",),
        "Use a fresh idempotency key for a different request.",
        "fix",
    ),
    "internal": _e(
        "A fault inside the node; nothing the caller did.",
        ("a bug",),
        "The node's log (`sensorium logs`) has the traceback; please report it.",
        "give-up",
    ),
    "job-lost": _e(
        "The connector restarted while the deferred job ran; how it ended is unknown.",
        ("the connector was killed mid-job",),
        "Check the job's effects before running it again.",
        "give-up",
    ),
    "observation-unknown": _e(
        "No observation has that id here, or it expired, or the caller may not read it.",
        (
            "a typo",
            "the observation passed `observations.store_ttl_s`",
            "a key not granted the action that produced it",
        ),
        "Query what exists with `sensorium observe query`.",
        "fix",
    ),
    "signature-invalid": _e(
        "The directive's signature does not verify against its issuer's did:key.",
        (
            "the directive was changed after signing",
            "signed with another key",
            "a signature that is not base64url of 64 bytes",
        ),
        "Sign the RFC 8785 JSON of the directive as sent, without `signature` and "
        "`issuer_delegation`, with the issuer's Ed25519 key.",
        "fix",
    ),
    "issuer-mismatch": _e(
        "The delegation's principal is not the directive's issuer.",
        ("a delegation issued for another participant",),
        "Use a delegation whose principal is the issuer the directive names.",
        "fix",
    ),
    "delegation-expired": _e(
        "The issuer delegation has expired by the node's clock.",
        ("an old delegation", "clock skew between the principal and the node"),
        "Obtain a fresh delegation from the principal.",
        "fix",
    ),
    "delegation-not-granted": _e(
        "The issuer delegation does not grant `sensorium.directive.invoke` for this action.",
        ("a delegation scoped to other actions",),
        "Ask the principal for a delegation whose grants cover the action id.",
        "fix",
    ),
    "operation-expired": _e(
        "The deferred operation reached its expiry without a terminal result.",
        ("the job ran longer than the operation's TTL",),
        "Raise the action's deferred TTL, or split the work.",
        "give-up",
    ),
    "operation-not-cancelable": _e(
        "The operation cannot be canceled (its action does not allow it, or it ended).",
        ("the deferred profile says `cancelable: false`",),
        "Wait for it to end: `sensorium ops wait ID`.",
        "give-up",
    ),
    "operation-unknown": _e(
        "No deferred operation has that id here, or it is not the caller's.",
        ("a typo", "another client's operation"),
        "Check the id the admission returned.",
        "fix",
    ),
    "outcome-in-doubt": _e(
        "The directive may have run, but its outcome was lost; it will not run again "
        "under the same idempotency key.",
        ("the connector or core died while the action ran",),
        "Check the action's effects; send a new directive with a new key if needed.",
        "give-up",
    ),
    "overloaded": _e(
        "The node is at its admission limit and refused the request unread.",
        ("more requests in flight than `limits.core_max_inflight`",),
        "Retry after `retry_after_ms`, with fewer requests in flight.",
        "retry",
    ),
    "poll-attempts-exhausted": _e(
        "The poller gave up on the operation after its bounded number of polls.",
        ("the connector did not answer for the operation's whole poll budget",),
        "`sensorium ops show ID` lists every attempt; check the connector's health.",
        "give-up",
    ),
    "recording-active": _e(
        "A recording is already running; one at a time.",
        ("`record start` twice",),
        "`sensorium record stop` first.",
        "fix",
    ),
    "recording-invalid": _e(
        "The recording cannot be made (its name is taken) or read (not a recording).",
        ("a reused name", "a file that is not a .srec recording"),
        "Pick another name, or check the file.",
        "fix",
    ),
    "result-not-inlined": _e(
        "Information, not an error: the action's structured result is too large to "
        "repeat at the top of the directive result.",
        ("a result over 32 KiB",),
        "Read it from the execution report: `sensorium/outcome` → `result.json`.",
        "fix",
    ),
    "reply-malformed": _e(
        "A reply did not decode as what was asked for.",
        ("client and node of different versions",),
        "Upgrade the client and the node together; `sensorium status` shows the version.",
        "give-up",
    ),
    "routing-id-in-use": _e(
        "Another live connection to the node presents the same ZeroMQ routing id; this "
        "connection is refused while it stays open, and the first keeps the id.",
        (
            "two sockets given the same ZMQ_ROUTING_ID (a copied configuration, a second "
            "instance of one program)",
            "a fixed routing id reused by a new socket while the old one is still open",
        ),
        "Leave ZMQ_ROUTING_ID unset (ZeroMQ picks a unique one), or give each socket its "
        "own; close this socket and open a new one.",
        "fix",
    ),
    "config-invalid": _e(
        "A file the `sensorium` command reads is unusable: the node's config/node.json, a "
        "key file, or the state directory itself. Nothing was done.",
        (
            "a hand edit left config/node.json invalid (the message names the file and the field)",
            "a key file with the wrong mode or owner",
            "a state directory this user cannot read (another user's, or root's)",
        ),
        "Fix the file the message names (`sensorium doctor` checks the node's files), or "
        "point --state-dir / SENSORIUM_STATE_DIR at this user's node.",
        "fix",
    ),
    "grant-unknown": _e(
        "`sensorium keys client add|grant` was given a grant that names no action and no "
        "group of the signed catalog; no key was written or changed.",
        (
            "a group's display name mistyped (`demo.fs` where the group is `demo.filesystem`)",
            "an action that is only in a drop-in not yet signed",
        ),
        "Use a name the message lists (groups, action ids, `PREFIX.*`, `*`, `audit`); "
        "sign the catalog first if the action is new.",
        "fix",
    ),
    "client-unknown": _e(
        "`sensorium keys client` was asked about a CURVE client the node has no key for.",
        ("a mistyped name", "a client already revoked"),
        "`sensorium keys client list` shows the clients the node knows.",
        "fix",
    ),
    "orphan-unknown": _e(
        "`sensorium orphans show` was given an id no orphan event of this node has.",
        ("a mistyped or shortened id", "another node's state directory"),
        "`sensorium orphans` lists the orphan events this node holds.",
        "fix",
    ),
    "reply-timeout": _e(
        "No reply came within the client's timeout; the request may still have run.",
        ("a reply timeout shorter than the action's timeout", "a stalled node"),
        "Size the reply timeout above the action's `timeout_ms`; retry with the same "
        "idempotency key so it does not run twice.",
        "retry",
    ),
    "request-malformed": _e(
        "The request does not decode as a request of this protocol.",
        ("a JSON body where MessagePack is expected", "a field of the wrong type"),
        "The error's `path` names the failing field; see docs/wire-protocol.md.",
        "fix",
    ),
    "request-too-large": _e(
        "The request is larger than the node accepts.",
        ("a parameter carrying a large payload",),
        "Pass large data as a file the action reads, not inline.",
        "fix",
    ),
    "shutting-down": _e(
        "The node is stopping and takes no new work.",
        ("`sensorium stop` or a systemd stop in progress",),
        "Retry once the node is back.",
        "retry",
    ),
    "spawn-failed": _e(
        "The program could not be started inside its sandbox.",
        ("the executable is missing", "the kernel refused a namespace, mount or Landlock"),
        "`sensorium doctor` says what this machine allows; the message names the step.",
        "operator",
    ),
    "storage-unavailable": _e(
        "The state directory cannot be written; nothing was done.",
        ("a full disk", "a read-only file system"),
        "Free space or fix the mount; the node resumes by itself.",
        "retry",
    ),
}


def explain(code: str) -> Explanation | None:
    return EXPLANATIONS.get(code)


def hint(code: str) -> str:
    """The line a CLI error ends with, so a user always knows the next step."""
    return f"  see: sensorium explain {code}" if code in EXPLANATIONS else ""


def troubleshooting_markdown() -> str:
    """docs/troubleshooting.md, generated: keyed by code, grouped by what to do."""
    lines = [
        "# Troubleshooting, by diagnostic code",
        "",
        "<!-- Generated from shared/explanations.py by `sensorium explain --markdown`; "
        "do not edit by hand. -->",
        "",
        "Every error the node or the CLI reports carries a stable code. "
        "`sensorium explain CODE` prints the same text as this page.",
        "",
        "What to do, in one word: **retry** (the same request may succeed later), "
        "**fix** (change the request), **operator** (the node's set-up must change), "
        "**give-up** (this request will not succeed as it is).",
        "",
    ]
    for code in sorted(EXPLANATIONS):
        e = EXPLANATIONS[code]
        lines += [f"## `{code}`", "", e.meaning, "", f"What to do ({e.remedy}): {e.action}", ""]
        lines += ["Usual causes:", ""] + [f"- {c}" for c in e.causes] + [""]
    return "\n".join(lines)
