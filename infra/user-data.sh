#!/bin/bash
# cloudtrain user-data: cloud-init runs this once, as root, late in the first boot
# (cloud-final.service), whether or not anyone ever reaches the instance over SSH.
#
# THIS FILE IS A TEMPLATE. cloudtrain's AWS provider renders it with plain Python
# str.replace() and sends the result as UserData. The placeholders are these names,
# each wrapped in two at-signs on both sides, and they occur only in the five
# here-documents below (never in comments, so a multi-line value cannot escape one):
#   JOB_ID               the cloudtrain job id
#   MAX_RUNTIME_MINUTES  integer minutes: the job's max runtime plus a safety margin
#   SHUTDOWN_COMMAND     shell command that powers the machine off
#                        (production: "shutdown -h now"; user-data already runs as root)
#   GPU_SOFTWARE         empty, or (a Volta type's Ubuntu) the script that installs the
#                        NVIDIA driver and torch (infra/volta-software.sh, rendered)
#   BOOT_SCRIPT          empty, or (a job of an Auto Scaling group) a bash script that
#                        writes the boot loader and runs it (providers/aws/group_launch.py)
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
#   CLOUDTRAIN_UD_REARM            where the re-arm script goes (default /usr/local/bin/cloudtrain-rearm)
#   CLOUDTRAIN_UD_SYSTEMD_DIR      present when systemd runs the machine (default /run/systemd/system)
#   CLOUDTRAIN_UD_WARM_DIR         the image's Python, read once at boot (default /opt/pytorch)

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

REARM=${CLOUDTRAIN_UD_REARM:-/usr/local/bin/cloudtrain-rearm}

log "job $JOB_ID: hard power-off in $MAX_MINUTES min"

# --- 1. Marker: proves to cloudtrain (and to a human) that user-data ran; the re-arm script
#     below keeps its watchdog_pid line current and reads the shutdown command from beside it.
if mkdir -p "$STATE_DIR" 2>/dev/null; then
    printf 'job_id=%s\nran_at=%s\nmax_runtime_minutes=%s\n' \
        "$JOB_ID" "$(now_utc)" "$MAX_MINUTES" >"$STATE_DIR/user-data-ran.tmp" &&
        mv -f "$STATE_DIR/user-data-ran.tmp" "$STATE_DIR/user-data-ran"
    printf '%s\n' "$SHUTDOWN_CMD" >"$STATE_DIR/shutdown-command"
else
    log "WARNING: cannot create $STATE_DIR"
fi

# --- 2. Hard power-off timers, through the re-arm script (one implementation for the first
#     arming and every later one). The agent runs it again (`sudo -n cloudtrain-rearm N`) at
#     each job start and, on a kept instance, at each job end, so the timer belongs to the job
#     that runs now, not to the first one.
REARM_SCRIPT=$(cat <<'CLOUDTRAIN_REARM_EOF'
#!/bin/bash
# cloudtrain-rearm MINUTES: power this instance off MINUTES from now, replacing the pending
# power-off: the scheduled `shutdown -h +N` (systemd) and the watchdog process whose pid is
# the watchdog_pid line of $STATE_DIR/user-data-ran. Installed by cloudtrain's user-data;
# run as root. The new timers are armed before the old ones go, so there is never a moment
# with none. Exit 0 when at least the watchdog is armed.
set -u
STATE_DIR=${CLOUDTRAIN_UD_STATE_DIR:-/var/lib/cloudtrain}
LOG=${CLOUDTRAIN_UD_LOG:-/var/log/cloudtrain-user-data.log}
SYSTEMD_DIR=${CLOUDTRAIN_UD_SYSTEMD_DIR:-/run/systemd/system}
MARKER=$STATE_DIR/user-data-ran
log() {
    line="$(date -u +%Y-%m-%dT%H:%M:%SZ) cloudtrain-rearm: $*"
    printf '%s\n' "$line" >&2
    # under user-data, stderr already goes to the log
    [ -n "${CLOUDTRAIN_UD_FROM_USER_DATA:-}" ] || printf '%s\n' "$line" >>"$LOG" 2>/dev/null
}
MINUTES=${1:-}
case $MINUTES in
    ''|*[!0-9]*) echo "usage: cloudtrain-rearm MINUTES (a whole number of minutes)" >&2; exit 2 ;;
esac
MINUTES=$((10#$MINUTES))
[ "$MINUTES" -ge 1 ] || MINUTES=1
SHUTDOWN_CMD=$(cat "$STATE_DIR/shutdown-command" 2>/dev/null)
[ -n "$SHUTDOWN_CMD" ] || SHUTDOWN_CMD='shutdown -h now'
# An instance of an Auto Scaling group: the watchdog ends the job's group before the
# power-off (the boot script wrote watchdog-command), or the group would start a replacement
# into the same timer; systemd's power-off then comes 5 min later, as the backstop.
WATCHDOG_CMD=$(cat "$STATE_DIR/watchdog-command" 2>/dev/null)
SYSTEMD_MINUTES=$MINUTES
if [ -n "$WATCHDOG_CMD" ]; then
    SYSTEMD_MINUTES=$((MINUTES + 5))
else
    WATCHDOG_CMD=$SHUTDOWN_CMD
fi
DELAY_S=${CLOUDTRAIN_UD_WATCHDOG_SECONDS:-$((MINUTES * 60))}
case $DELAY_S in ''|*[!0-9]*) DELAY_S=$((MINUTES * 60)) ;; esac
OLD_PID=$(sed -n 's/^watchdog_pid=\([0-9][0-9]*\)$/\1/p' "$MARKER" 2>/dev/null | tail -n 1)

# (b) first, always: a detached watchdog that runs the shutdown command after the delay. It
#     outlives its caller (cloud-final.service uses KillMode=process; setsid/nohup shield it
#     from hangups) and must not hold the caller's stdout open (cloud-init waits for it).
#     `;` and not `&&`: even if the sleep is killed, the machine still powers off.
WATCHDOG_OUT=/dev/null
[ -w "$LOG" ] && WATCHDOG_OUT=$LOG
SETSID=$(command -v setsid 2>/dev/null)
# shellcheck disable=SC2086,SC2016  # $SETSID may be empty; $1/$2 belong to the inner sh
nohup $SETSID sh -c 'sleep "$1"; echo "cloudtrain watchdog: max runtime reached, powering off"; eval "$2"' \
    cloudtrain-watchdog "$DELAY_S" "$WATCHDOG_CMD" </dev/null >>"$WATCHDOG_OUT" 2>&1 &
NEW_PID=$!
log "watchdog pid $NEW_PID fires in ${DELAY_S}s"
if [ -f "$MARKER" ]; then
    grep -v '^watchdog_pid=' "$MARKER" >"$MARKER.tmp" 2>/dev/null
    printf 'watchdog_pid=%s\n' "$NEW_PID" >>"$MARKER.tmp" && mv -f "$MARKER.tmp" "$MARKER"
elif [ -d "$STATE_DIR" ]; then
    printf 'watchdog_pid=%s\n' "$NEW_PID" >"$MARKER"
fi

# (a) systemd: `shutdown -h +N` hands the schedule to systemd-logind, which keeps one; it
#     outlives this script and returns at once (sysvinit's would block, hence only under
#     systemd). Side effect: non-root SSH logins are refused in the last 5 min.
if [ -d "$SYSTEMD_DIR" ] && command -v shutdown >/dev/null 2>&1; then
    shutdown -c 2>/dev/null  # nothing pending is fine
    if shutdown -h "+$SYSTEMD_MINUTES" "cloudtrain: power-off in $SYSTEMD_MINUTES min"; then
        log "scheduled: shutdown -h +$SYSTEMD_MINUTES"
    else
        log "WARNING: shutdown -h +$SYSTEMD_MINUTES failed; relying on the watchdog"
    fi
fi

# The previous watchdog goes last, and only if that pid is still a watchdog of ours (pids
# are reused). Its sh first, so that a killed sleep cannot let it run the shutdown.
if [ -n "$OLD_PID" ] && [ "$OLD_PID" != "$NEW_PID" ] &&
        tr '\0' ' ' <"/proc/$OLD_PID/cmdline" 2>/dev/null | grep -q cloudtrain-watchdog; then
    kill -TERM "$OLD_PID" 2>/dev/null
    kill -TERM -- "-$OLD_PID" 2>/dev/null  # its sleep, where setsid made it a group leader
    log "cancelled watchdog pid $OLD_PID"
fi
exit 0
CLOUDTRAIN_REARM_EOF
)
# Installed for the agent; if that fails, the first arming still runs from the text above.
if mkdir -p "$(dirname "$REARM")" 2>/dev/null &&
        printf '%s\n' "$REARM_SCRIPT" >"$REARM.tmp" 2>/dev/null &&
        chmod 0755 "$REARM.tmp" && mv -f "$REARM.tmp" "$REARM"; then
    CLOUDTRAIN_UD_FROM_USER_DATA=1 "$REARM" "$MAX_MINUTES"
else
    log "WARNING: cannot install $REARM; arming from user-data only"
    CLOUDTRAIN_UD_FROM_USER_DATA=1 bash -c "$REARM_SCRIPT" cloudtrain-rearm "$MAX_MINUTES"
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

# --- 4. The GPU software the image lacks (a Volta type's Ubuntu: the driver and torch),
#     empty for every other job. A failure is logged and its exit code kept in
#     software-failed, where cloudtrain's setup reads it; never fatal here (the timers stand).
SOFTWARE=$(cat <<'CLOUDTRAIN_SOFTWARE_EOF'
@@GPU_SOFTWARE@@
CLOUDTRAIN_SOFTWARE_EOF
)
case $SOFTWARE in
    ''|@@*) ;;
    *)
        rm -f "$STATE_DIR/software-failed"
        if printf '%s\n' "$SOFTWARE" >"$STATE_DIR/software.sh" &&
                bash "$STATE_DIR/software.sh"; then
            log "software: installed"
        else
            CODE=$?
            log "WARNING: the software install failed (exit $CODE)"
            printf 'exit=%s\n' "$CODE" >"$STATE_DIR/software-failed"
        fi ;;
esac

# --- 5. The image's shared libraries read once, in the background: a root volume restored
#     from the image's snapshot fetches each block from S3 the first time it is read, and
#     torch's and CUDA's libraries (GBs) would otherwise be fetched at the job's first
#     `import torch`, on the clock. How long it took is kept in warm-read for the timeline.
WARM_DIR=${CLOUDTRAIN_UD_WARM_DIR:-/opt/pytorch}
if [ -d "$WARM_DIR" ] && [ -d "$STATE_DIR" ]; then
    (
        START=$(date +%s)
        BYTES=$(find "$WARM_DIR" -type f -name '*.so*' -printf '%s\n' 2>/dev/null |
                awk '{ s += $1 } END { printf "%d", s }')
        find "$WARM_DIR" -type f -name '*.so*' -print0 2>/dev/null |
            xargs -0 -r -n 32 -P 4 cat >/dev/null 2>&1
        printf 'seconds=%s\nbytes=%s\n' "$(($(date +%s) - START))" "${BYTES:-0}" \
            >"$STATE_DIR/warm-read.tmp" && mv -f "$STATE_DIR/warm-read.tmp" "$STATE_DIR/warm-read"
    ) </dev/null >/dev/null 2>&1 &
    log "reading $WARM_DIR's shared libraries once, in the background"
fi

# Second marker: setup steps that need tmux/rsync (and the software) wait for this file.
[ -d "$STATE_DIR" ] && now_utc >"$STATE_DIR/user-data-done"

# A job of an Auto Scaling group (a recovering spot job): every instance of the group starts the
# job by itself. BOOT_SCRIPT (rendered by cloudtrain's AWS provider, empty for every other job)
# writes the boot loader and runs it, detached: it fetches bootstrap.py and the host files from
# the job store with the instance role, checks their sha256, and bootstrap.py starts the job
# from its bundle (or, on the group's first instance, leaves it to the launching machine).
# Detached, so that this script ends and cloud-init prints the host keys to the console.
BOOT_SCRIPT=$(cat <<'CLOUDTRAIN_BOOT_EOF'
@@BOOT_SCRIPT@@
CLOUDTRAIN_BOOT_EOF
)
case $BOOT_SCRIPT in
    ''|@@*) ;;
    *)
        if [ -d "$STATE_DIR" ] && printf '%s\n' "$BOOT_SCRIPT" >"$STATE_DIR/boot.sh"; then
            SETSID=$(command -v setsid 2>/dev/null)
            nohup $SETSID bash "$STATE_DIR/boot.sh" </dev/null >>"$LOG" 2>&1 &
            log "boot: started (pid $!): the job starts from its bundle in the job store"
        else
            log "WARNING: cannot write $STATE_DIR/boot.sh: this instance cannot start the job"
        fi ;;
esac
log "done"
exit 0
