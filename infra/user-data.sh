#!/bin/bash
# cloudtrain user-data: cloud-init runs this once, as root, late in the first boot
# (cloud-final.service), whether or not anyone ever reaches the instance over SSH.
#
# THIS FILE IS A TEMPLATE. cloudtrain's AWS provider renders it with plain Python
# str.replace() and sends the result as UserData. The placeholders are these names,
# each wrapped in two at-signs on both sides, and they occur only in the three
# here-documents below (never in comments, so a multi-line value cannot escape one):
#   JOB_ID               the cloudtrain job id
#   MAX_RUNTIME_MINUTES  integer minutes: the job's max runtime plus a safety margin
#   SHUTDOWN_COMMAND     shell command that powers the machine off
#                        (production: "shutdown -h now"; user-data already runs as root)
# No other templating and no escaping: the here-documents are quoted, so any
# characters in the values are safe. Users never pass this file themselves.
#
# Why it matters: every instance is launched with InstanceInitiatedShutdownBehavior=
# terminate, so a power-off from inside the OS terminates the instance, billing stops
# and the root volume (DeleteOnTermination) goes with it. The timers below are the
# last line of defence when the CLI, SSH or the agent never come up.
#
# Test-only environment overrides (cloud-init sets none of them):
#   CLOUDTRAIN_UD_STATE_DIR        marker directory   (default /var/lib/cloudtrain)
#   CLOUDTRAIN_UD_LOG              log file           (default /var/log/cloudtrain-user-data.log)
#   CLOUDTRAIN_UD_WATCHDOG_SECONDS fallback watchdog delay in seconds (default minutes*60)

# -u catches typos; no -e: nothing below may stop the power-off timers from being armed.
set -u

JOB_ID=$(cat <<'CLOUDTRAIN_EOF'
@@JOB_ID@@
CLOUDTRAIN_EOF
)
MAX_MINUTES=$(cat <<'CLOUDTRAIN_EOF'
@@MAX_RUNTIME_MINUTES@@
CLOUDTRAIN_EOF
)
SHUTDOWN_CMD=$(cat <<'CLOUDTRAIN_EOF'
@@SHUTDOWN_COMMAND@@
CLOUDTRAIN_EOF
)

STATE_DIR=${CLOUDTRAIN_UD_STATE_DIR:-/var/lib/cloudtrain}
LOG=${CLOUDTRAIN_UD_LOG:-/var/log/cloudtrain-user-data.log}
FALLBACK_MINUTES=1440  # used only if the template was not rendered properly

now_utc() { date -u +%Y-%m-%dT%H:%M:%SZ; }
log() { printf '%s cloudtrain-user-data: %s\n' "$(now_utc)" "$*"; }

# Log to our own file and keep stdout too: cloud-init copies stdout to
# /var/log/cloud-init-output.log and to the serial console, which is what
# `ec2:GetConsoleOutput` (and so cloudtrain, when SSH never answers) can show.
mkdir -p "$(dirname "$LOG")" 2>/dev/null
if touch "$LOG" 2>/dev/null; then
    exec > >(tee -a "$LOG") 2>&1
else
    LOG=/dev/null
fi

# A half-rendered template must still end in a bounded power-off, never none.
case $JOB_ID in ''|*@@*) JOB_ID=unknown ;; esac
case $MAX_MINUTES in
    ''|*[!0-9]*) log "max runtime '$MAX_MINUTES' is not an integer; using $FALLBACK_MINUTES min"
                 MAX_MINUTES=$FALLBACK_MINUTES ;;
esac
MAX_MINUTES=$((10#$MAX_MINUTES))  # strip leading zeros (would read as octal)
[ "$MAX_MINUTES" -ge 1 ] || MAX_MINUTES=1
case $SHUTDOWN_CMD in ''|*@@*) SHUTDOWN_CMD='shutdown -h now' ;; esac
DELAY_S=${CLOUDTRAIN_UD_WATCHDOG_SECONDS:-$((MAX_MINUTES * 60))}
case $DELAY_S in ''|*[!0-9]*) DELAY_S=$((MAX_MINUTES * 60)) ;; esac

log "job $JOB_ID: hard power-off in $MAX_MINUTES min"

# --- 1. Hard power-off timers: armed first, before anything that can fail. ------------
# (a) systemd: `shutdown -h +N` hands the schedule to systemd-logind, so it outlives this
#     script and cloud-init. It returns at once (sysvinit's would block, hence only
#     under systemd). Side effect: non-root SSH logins are refused in the last 5 min.
if [ -d /run/systemd/system ] && command -v shutdown >/dev/null 2>&1; then
    if shutdown -h "+$MAX_MINUTES" "cloudtrain job $JOB_ID reached its max runtime"; then
        log "scheduled: shutdown -h +$MAX_MINUTES"
    else
        log "WARNING: shutdown -h +$MAX_MINUTES failed; relying on the watchdog"
    fi
fi
# (b) Always: a detached watchdog that runs the shutdown command after the delay. It
#     survives this script ending because cloud-final.service uses KillMode=process and
#     setsid/nohup shield it from hangups; its output must not hold cloud-init's stdout
#     pipe open (cloud-init waits for it), so it writes to the log file or /dev/null.
#     `;` and not `&&`: even if the sleep is killed, the machine still powers off.
WATCHDOG_OUT=/dev/null
[ "$LOG" != /dev/null ] && WATCHDOG_OUT=$LOG
SETSID=$(command -v setsid 2>/dev/null)
# shellcheck disable=SC2086,SC2016  # $SETSID may be empty; $1/$2 belong to the inner sh
nohup $SETSID sh -c 'sleep "$1"; echo "cloudtrain watchdog: max runtime reached, powering off"; eval "$2"' \
    cloudtrain-watchdog "$DELAY_S" "$SHUTDOWN_CMD" </dev/null >>"$WATCHDOG_OUT" 2>&1 &
WATCHDOG_PID=$!
log "watchdog pid $WATCHDOG_PID fires in ${DELAY_S}s"

# --- 2. Marker: proves to cloudtrain (and to a human) that user-data ran. -------------
if mkdir -p "$STATE_DIR" 2>/dev/null; then
    printf 'job_id=%s\nran_at=%s\nmax_runtime_minutes=%s\nwatchdog_pid=%s\n' \
        "$JOB_ID" "$(now_utc)" "$MAX_MINUTES" "$WATCHDOG_PID" >"$STATE_DIR/user-data-ran.tmp" &&
        mv -f "$STATE_DIR/user-data-ran.tmp" "$STATE_DIR/user-data-ran"
else
    log "WARNING: cannot create $STATE_DIR"
fi

# --- 3. tmux and rsync, best effort (the Deep Learning AMIs usually have both). -------
# At first boot apt's lock may still be held by unattended-upgrades: wait for it, but
# bounded. A failure here is logged, never fatal: the timers above are already armed.
MISSING=()
for tool in tmux rsync; do
    command -v "$tool" >/dev/null 2>&1 || MISSING+=("$tool")
done
if [ "${#MISSING[@]}" -gt 0 ]; then
    log "installing: ${MISSING[*]}"
    if command -v apt-get >/dev/null 2>&1; then
        export DEBIAN_FRONTEND=noninteractive
        timeout 600 apt-get -q -o DPkg::Lock::Timeout=300 update
        timeout 900 apt-get -q -y -o DPkg::Lock::Timeout=300 install "${MISSING[@]}"
    elif command -v dnf >/dev/null 2>&1; then
        timeout 900 dnf -q -y install "${MISSING[@]}"
    elif command -v yum >/dev/null 2>&1; then
        timeout 900 yum -q -y install "${MISSING[@]}"
    else
        log "WARNING: no apt-get, dnf or yum"
    fi
    for tool in "${MISSING[@]}"; do
        command -v "$tool" >/dev/null 2>&1 || log "WARNING: $tool still missing"
    done
fi

# Second marker: setup steps that need tmux/rsync can wait for this file.
[ -d "$STATE_DIR" ] && now_utc >"$STATE_DIR/user-data-done"
log "done"
exit 0
