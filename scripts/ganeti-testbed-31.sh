# ganeti-testbed-31.sh - the Ganeti 3.1 testbed of a Debian 12 machine, sourced by scripts/ganeti-testbed
# (`up|down|status|ns|env --version 3.1`). Not run on its own. On Debian 13 the machine's own packages
# are 3.1: scripts/ganeti-testbed then runs 3.1 as it runs 3.0 on Debian 12, and this file is not used.
#
# A single-node Ganeti 3.1 (Debian 13 packages) in a chroot, beside (not instead of) the 3.0 testbed:
#   chroot     $V31_ROOT (/srv/ganeti31-root): debootstrap --variant=minbase trixie, then apt-get install
#              ganeti (3.1.0~rc2: ganeti-3.1, ganeti-haskell-3.1, ganeti-htools-3.1) ganeti-os-noop
#   network    netns g31: lo and a port-less bridge g31br0, node1.g31.test = 198.51.100.20/24, master IP
#              cluster.g31.test = 198.51.100.120/32; no link to anything, no route out
#   mount ns   pinned on $V31_PIN/mnt, made once from inside the netns: the chroot's /proc, its /sys (a
#              sysfs of the netns: Ganeti checks /sys/class/net/g31br0/bridge), /dev and /run (a bind of
#              $V31_PIN/run). These mounts exist only there, never in the machine's mount table, so
#              deleting the chroot never reaches the machine's /dev or /proc.
#   UTS ns     pinned on $V31_PIN/uts: hostname node1.g31.test
#   RAPI       ganeti-rapi in the netns on 127.0.0.1:5080; a forwarder in two halves (the chroot's socat:
#              TCP 127.0.0.1:5081 in the root netns -> a Unix socket in the chroot's /run -> TCP
#              127.0.0.1:5080 in the netns) joins it to the machine: a veth would need an address in
#              198.51.100.0/24, which the 3-node 3.0 testbed's gm-root holds, and bookworm's socat has no
#              netns= option. Users file: ci ci write. CA: $V31_ROOT/var/lib/ganeti/rapi.pem.
#   queue      $V31_ROOT/var/lib/ganeti/queue, an ordinary directory of the machine: inotify from the
#              root namespace sees it (the tests' QueueWatcher).
# Written from the lab notes of a 3.1 cluster built on this machine (shared/ganeti/v31/NOTES.md); why:
# * The `ganeti` postinst runs `invoke-rc.d ganeti start` and openssh-server (a dependency) starts sshd:
#   in a chroot both would start in the machine's root netns. A policy-rc.d (exit 101) goes in first.
# * adduser gives the chroot's system users the first free IDs of the chroot (100, 101, ...), which
#   belong to other users of the machine (ps showed 3.1's luxid as postgres). The chroot's adduser.conf
#   gets its own range (3100-3199) after adduser is installed and before ganeti is.
# * start-stop-daemon (trixie's dpkg as bookworm's) refuses to start a daemon whose non-root pidfile
#   exists: each daemon is checked (`daemon-util check`) and only dead ones started; ganeti-kvmd exits
#   at once ("KVM not enabled") unless kvm is an enabled hypervisor, so it is left out.
# * After a restart luxid puts the master IP back within ~2 s; if not within 10 s, activate-master-ip.
# * No cron in the chroot (no watcher, no job archiving: `ns --version 3.1 gnt-job autoarchive 0`).
# * The versioned packages alone (ganeti-3.1, ganeti-haskell-3.1) have no gnt-* commands, no
#   daemon-util, no users: the `ganeti` package brings them.
# * No PID namespace: ps shows both versions' daemons under the same names (3.1's run as UIDs
#   3100-3103). `down` ends the processes of the lab's namespaces by PID; never stop them by name.

V31_ROOT=${SGTB31_ROOT:-/srv/ganeti31-root}
V31_SUITE=${SGTB31_SUITE:-trixie}
V31_MIRROR=${SGTB31_MIRROR:-http://deb.debian.org/debian}
V31_NS=g31
V31_BR=g31br0
V31_NODE_IP=198.51.100.20
V31_CLUSTER_IP=198.51.100.120
V31_NODE=node1.g31.test
V31_CLUSTER=cluster.g31.test
V31_RAPI_PORT=5081                 # root namespace, 127.0.0.1
V31_RAPI_INNER_PORT=5080           # ganeti-rapi inside the netns (its default)
V31_PIN=/run/g31                   # namespace pins, forwarder pidfiles and log; the chroot's /run
V31_RAPI_SOCK=/run/g31-rapi.sock   # chroot-side path of the Unix socket between the forwarder halves
V31_ID_FIRST=3100
V31_ID_LAST=3199
V31_PACKAGES="ganeti ganeti-3.1 ganeti-haskell-3.1 ganeti-os-noop socat curl iproute2"
V31_DU=/usr/lib/ganeti/daemon-util   # inside the chroot
V31_ENV=(/usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
         HOME=/root LC_ALL=C.UTF-8 TERM="${TERM:-dumb}")

v31_netns_exists() { mountpoint -q "/run/netns/$V31_NS" 2>/dev/null; }
v31_pinned() { mountpoint -q "$V31_PIN/mnt" 2>/dev/null && mountpoint -q "$V31_PIN/uts" 2>/dev/null; }
v31_up_already() { v31_netns_exists && v31_pinned; }

# v31_in CMD...: CMD chrooted, in the lab's network, mount and UTS namespaces, with a clean environment.
v31_in() {
  nsenter --net="/run/netns/$V31_NS" --mount="$V31_PIN/mnt" --uts="$V31_PIN/uts" \
    chroot "$V31_ROOT" "${V31_ENV[@]}" "$@"
}
# v31_in_rootnet CMD...: chrooted, the lab's mount namespace, the ROOT network namespace.
v31_in_rootnet() { nsenter --mount="$V31_PIN/mnt" chroot "$V31_ROOT" "${V31_ENV[@]}" "$@"; }

# v31_pids: every process in the lab's network or mount namespace (daemons, their children, the
# forwarder halves, shells of `ns`).
v31_pids() {
  local mntid p
  if v31_netns_exists; then ip netns pids "$V31_NS" 2>/dev/null || true; fi
  if mountpoint -q "$V31_PIN/mnt" 2>/dev/null; then
    mntid="mnt:[$(stat -L -c %i "$V31_PIN/mnt")]"
    for p in /proc/[0-9]*; do
      [ "$(readlink "$p/ns/mnt" 2>/dev/null)" != "$mntid" ] || echo "${p#/proc/}"
    done
  fi
}

v31_alive() {  # the PIDs among the arguments that still exist and are no zombies
  local p st
  for p in "$@"; do
    st=$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null) || continue
    [ "$st" = Z ] || echo "$p"
  done
}

# v31_pid_is PIDFILE WORD: the PID in PIDFILE lives and its command line holds WORD.
v31_pid_is() {
  local p
  p=$(cat "$1" 2>/dev/null) || return 1
  [ -n "$p" ] && [ -r "/proc/$p/cmdline" ] && tr '\0' ' ' <"/proc/$p/cmdline" | grep -- "$2" >/dev/null
}

v31_rapi_code() {  # v31_rapi_code METHOD PATH -> HTTP status of an authenticated request on 5081
  local curl=(curl)
  if ! command -v curl >/dev/null; then
    v31_pinned || { echo 000; return 0; }
    curl=(v31_in_rootnet curl)
  fi
  "${curl[@]}" -sk -o /dev/null -w '%{http_code}' -u "$RAPI_USER:$RAPI_PASSWORD" -H 'Content-Length: 0' \
    -X "$1" "https://127.0.0.1:$V31_RAPI_PORT$2" 2>/dev/null || true
}

# ---------------------------------------------------------------- the chroot and its packages
v31_host_tools() {
  local need=""
  command -v debootstrap >/dev/null || need="$need debootstrap"
  { command -v nsenter >/dev/null && command -v unshare >/dev/null && command -v mountpoint >/dev/null; } \
    || need="$need util-linux"
  command -v ip >/dev/null || need="$need iproute2"
  [ -z "$need" ] && return 0
  command -v apt-get >/dev/null || fail "no apt-get: the 3.1 testbed needs a Debian machine"
  say "installing on the machine:$need"
  ls /var/lib/apt/lists/ 2>/dev/null | grep '_Packages' >/dev/null || apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q -o DPkg::Lock::Timeout=300 --no-install-recommends $need >/dev/null
}

# v31_chroot: debootstrap into $V31_ROOT.new, renamed when it succeeded (an interrupted run never leaves
# a half-made chroot that looks present), in a private mount namespace (the /proc and /sys debootstrap
# mounts in the target go away with it, even if it is killed).
v31_chroot() {
  if [ -e "$V31_ROOT/etc/g31-debootstrap-done" ]; then return 0; fi
  [ -e "$V31_ROOT" ] && fail "$V31_ROOT exists but is no finished chroot (no etc/g31-debootstrap-done): remove it, or run '$0 down --version 3.1 --purge-root'"
  if [ -e "$V31_ROOT.new" ]; then
    awk -v r="$V31_ROOT.new" '$5 == r || index($5, r "/") == 1 {found = 1} END {exit !found}' /proc/self/mountinfo \
      && fail "something is mounted under $V31_ROOT.new"
    say "removing a leftover $V31_ROOT.new"
    rm -rf --one-file-system "$V31_ROOT.new"
  fi
  say "debootstrap --variant=minbase $V31_SUITE $V31_ROOT ($V31_MIRROR)"
  mkdir -p "$(dirname "$V31_ROOT")"
  unshare -m --propagation private debootstrap --variant=minbase "$V31_SUITE" "$V31_ROOT.new" "$V31_MIRROR" \
    >/tmp/ganeti-testbed-31-debootstrap.log 2>&1 \
    || { tail -20 /tmp/ganeti-testbed-31-debootstrap.log >&2; fail "debootstrap failed (log /tmp/ganeti-testbed-31-debootstrap.log)"; }
  date -u +%FT%TZ >"$V31_ROOT.new/etc/g31-debootstrap-done"
  mv "$V31_ROOT.new" "$V31_ROOT"
}

v31_packages() {
  # no maintainer script may start a service: in a chroot it runs in the machine's root netns
  printf '#!/bin/sh\n# written by synnefo-ganeti scripts/ganeti-testbed: no service starts from maintainer scripts\nexit 101\n' \
    >"$V31_ROOT/usr/sbin/policy-rc.d"
  chmod 755 "$V31_ROOT/usr/sbin/policy-rc.d"
  printf '%s\n' 'APT::Install-Recommends "false";' 'APT::Install-Suggests "false";' 'Acquire::Languages "none";' \
    >"$V31_ROOT/etc/apt/apt.conf.d/90synnefo-ganeti-testbed"
  local missing="" p
  for p in $V31_PACKAGES; do
    chroot "$V31_ROOT" dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep "install ok installed" >/dev/null \
      || missing="$missing $p"
  done
  [ -z "$missing" ] && return 0
  say "installing in the chroot:$missing"
  # a private mount namespace with /proc, /sys, /dev and the machine's resolv.conf (apt needs DNS;
  # the chroot's own says nameserver 127.0.0.1)
  touch "$V31_ROOT/etc/resolv.conf"
  unshare -m --propagation private sh -ec '
    R=$1; IDF=$2; IDL=$3; shift 3
    mount -t proc proc "$R/proc"
    mount -t sysfs sysfs "$R/sys"
    mount --rbind /dev "$R/dev"
    mount --bind /etc/resolv.conf "$R/etc/resolv.conf"
    E="env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LC_ALL=C.UTF-8 DEBIAN_FRONTEND=noninteractive"
    ls "$R/var/lib/apt/lists/" | grep _Packages >/dev/null || chroot "$R" $E apt-get update -q
    # the system users of the chroot get IDs of their own before any package makes them (minbase has
    # no adduser: it goes first, else dpkg stops at a conffile prompt over adduser.conf)
    chroot "$R" dpkg-query -W -f="\${Status}" adduser 2>/dev/null | grep "install ok installed" >/dev/null \
      || chroot "$R" $E apt-get install -y -q adduser
    if ! grep "^FIRST_SYSTEM_UID=" "$R/etc/adduser.conf" >/dev/null; then
      printf "%s\n" "# synnefo-ganeti testbed: system users and groups apart from the machine'"'"'s" \
        "FIRST_SYSTEM_UID=$IDF" "LAST_SYSTEM_UID=$IDL" "FIRST_SYSTEM_GID=$IDF" "LAST_SYSTEM_GID=$IDL" \
        >>"$R/etc/adduser.conf"
    fi
    chroot "$R" $E apt-get install -y -q "$@"
    chroot "$R" $E apt-get clean
  ' sh "$V31_ROOT" "$V31_ID_FIRST" "$V31_ID_LAST" $missing >/tmp/ganeti-testbed-31-apt.log 2>&1 \
    || { tail -30 /tmp/ganeti-testbed-31-apt.log >&2; fail "apt-get install in the chroot failed (log /tmp/ganeti-testbed-31-apt.log)"; }
  local f id other
  for f in passwd group; do
    for id in $(awk -F: '/^gnt-/ {print $3}' "$V31_ROOT/etc/$f"); do
      other=$(awk -F: -v i="$id" '$3 == i {print $1}' "/etc/$f")
      [ -z "$other" ] || say "WARNING: the chroot's $f ID $id is '$other' on the machine"
    done
  done
}

v31_config() {
  cat >"$V31_ROOT/etc/hosts" <<EOF
# written by synnefo-ganeti scripts/ganeti-testbed: this chroot is only used inside netns $V31_NS
127.0.0.1 localhost
::1 localhost ip6-localhost ip6-loopback
$V31_NODE_IP $V31_NODE ${V31_NODE%%.*}
$V31_CLUSTER_IP $V31_CLUSTER ${V31_CLUSTER%%.*}
EOF
  echo "nameserver 127.0.0.1" >"$V31_ROOT/etc/resolv.conf"   # no DNS in the lab
  echo "$V31_NODE" >"$V31_ROOT/etc/hostname"
  local d
  mkdir -p "$V31_ROOT$FILE_DIR" "$V31_ROOT$SHARED_FILE_DIR"
  for d in "$FILE_DIR" "$SHARED_FILE_DIR"; do
    grep -qx "$d" "$V31_ROOT/etc/ganeti/file-storage-paths" 2>/dev/null || echo "$d" >>"$V31_ROOT/etc/ganeti/file-storage-paths"
  done
  # no cron runs in the chroot; a cron started there by hand would restart daemons outside the namespaces
  if grep '^[^#].*ganeti-\(watcher\|cleaner\)' "$V31_ROOT/etc/cron.d/ganeti" >/dev/null 2>&1; then
    sed -i 's/^\([^#].*ganeti-\(watcher\|cleaner\).*\)$/#ganeti-testbed# \1/' "$V31_ROOT/etc/cron.d/ganeti"
  fi
}

# ---------------------------------------------------------------- namespaces
v31_namespaces() {
  local left
  # the mount namespace's sysfs belongs to the netns it was mounted from: the two are made together
  if ! v31_netns_exists && { v31_pinned || [ -n "$(v31_pids)" ]; }; then
    left=$(v31_pids | sort -u | tr '\n' ' ')
    [ -z "${left// /}" ] || fail "netns $V31_NS is gone but processes of the 3.1 testbed run ($left): run '$0 down --version 3.1' first"
    umount "$V31_PIN/mnt" "$V31_PIN/uts" 2>/dev/null || true
  fi
  if ! v31_netns_exists; then
    [ -e "/run/netns/$V31_NS" ] && rm -f "/run/netns/$V31_NS"   # no mount: left by a reboot with a persistent /run
    ip netns add "$V31_NS"
  fi
  ip -n "$V31_NS" link set lo up
  ip -n "$V31_NS" link show "$V31_BR" >/dev/null 2>&1 || ip -n "$V31_NS" link add "$V31_BR" type bridge
  ip -n "$V31_NS" link set "$V31_BR" up
  ip -n "$V31_NS" -4 addr show dev "$V31_BR" | grep " $V31_NODE_IP/" >/dev/null \
    || ip -n "$V31_NS" addr add "$V31_NODE_IP/24" dev "$V31_BR"
  if ! v31_pinned; then
    left=$(ip netns pids "$V31_NS" 2>/dev/null | tr '\n' ' ')
    [ -z "${left// /}" ] || fail "the 3.1 testbed's mount namespace is gone but processes run in netns $V31_NS ($left): run '$0 down --version 3.1' first"
    mkdir -p "$V31_PIN"
    mountpoint -q "$V31_PIN" || mount --bind "$V31_PIN" "$V31_PIN"
    mount --make-private "$V31_PIN"   # unshare --mount=FILE needs a private parent mount
    touch "$V31_PIN/mnt" "$V31_PIN/uts"
    # the chroot's /run, emptied as at boot (no process of the lab runs)
    rm -rf --one-file-system "$V31_PIN/run"
    mkdir -p -m 0755 "$V31_PIN/run"
    nsenter --net="/run/netns/$V31_NS" \
      unshare --mount="$V31_PIN/mnt" --uts="$V31_PIN/uts" --propagation private sh -ec '
        R=$1; H=$2; RUN=$3
        echo "$H" > /proc/sys/kernel/hostname
        # the copy of the machine'"'"'s mount table holds the pins of other namespaces (/run/netns,
        # the 3-node testbed'"'"'s /run/ganeti-multi): they would keep those alive as long as this one
        if mountpoint -q /run/netns; then umount -R /run/netns || umount -l /run/netns; fi
        for m in $(findmnt -rn -t nsfs -o TARGET); do umount -l "$m" 2>/dev/null || true; done
        mount -t proc -o nosuid,nodev,noexec proc "$R/proc"
        mount -t sysfs -o nosuid,nodev,noexec sysfs "$R/sys"
        mount --rbind /dev "$R/dev"
        mount --bind "$RUN" "$R/run"
        mkdir -p -m 1777 "$R/run/lock"
      ' sh "$V31_ROOT" "$V31_NODE" "$V31_PIN/run" || fail "cannot make the 3.1 testbed's mount namespace"
  fi
  local fqdn
  fqdn=$(v31_in python3 -c 'import socket; print(socket.getfqdn())' 2>/dev/null || true)
  [ "$fqdn" = "$V31_NODE" ] || fail "in the 3.1 testbed the FQDN is '$fqdn', not $V31_NODE"
  v31_in test -e "/sys/class/net/$V31_BR/bridge" || fail "the 3.1 testbed's /sys shows no bridge $V31_BR"
}

# ---------------------------------------------------------------- cluster and RAPI
v31_has_mip() { ip -n "$V31_NS" -4 addr show dev "$V31_BR" | grep " $V31_CLUSTER_IP/" >/dev/null; }

v31_cluster() {
  if [ ! -s "$V31_ROOT/var/lib/ganeti/config.data" ]; then
    say "gnt-cluster init $V31_CLUSTER (node $V31_NODE, Ganeti 3.1)"
    v31_in gnt-cluster init --no-ssh-init --no-etc-hosts \
      --enabled-hypervisors=fake --enabled-disk-templates=diskless,file \
      --file-storage-dir="$FILE_DIR" --shared-file-storage-dir="$SHARED_FILE_DIR" \
      --master-netdev="$V31_BR" --master-netmask=32 \
      --nic-parameters="mode=bridged,link=$V31_BR" "$V31_CLUSTER" >/dev/null || fail "gnt-cluster init failed"
  fi
  local d
  for d in $(v31_in "$V31_DU" list-start-daemons); do
    if [ "$d" = ganeti-kvmd ] && ! grep -qx kvm "$V31_ROOT/var/lib/ganeti/ssconf_hypervisor_list" 2>/dev/null; then
      continue
    fi
    v31_in "$V31_DU" check "$d" && continue
    v31_in sh -c 'rm -f "$("$1" daemon-pidfile "$2")"' sh "$V31_DU" "$d"
    v31_in "$V31_DU" start "$d" >/dev/null || fail "could not start $d (Ganeti 3.1)"
  done
  local i
  for i in $(seq 1 40); do v31_has_mip && break; sleep 0.25; done
  if ! v31_has_mip; then
    say "master IP $V31_CLUSTER_IP missing: gnt-cluster activate-master-ip"
    v31_in gnt-cluster activate-master-ip || say "WARNING: activate-master-ip failed"
  fi
}

v31_rapi() {
  v31_in sh -ec '
    mkdir -p /var/lib/ganeti/rapi
    printf "%s %s write\n" "$1" "$2" > /var/lib/ganeti/rapi/users.tmp
    chown gnt-rapi:gnt-masterd /var/lib/ganeti/rapi/users.tmp
    chmod 640 /var/lib/ganeti/rapi/users.tmp
    mv -f /var/lib/ganeti/rapi/users.tmp /var/lib/ganeti/rapi/users   # ganeti-rapi re-reads it (inotify)
  ' sh "$RAPI_USER" "$RAPI_PASSWORD"
  if ! v31_pid_is "$V31_PIN/rapi-inner.pid" "UNIX-LISTEN:$V31_RAPI_SOCK"; then
    setsid nsenter --net="/run/netns/$V31_NS" --mount="$V31_PIN/mnt" --uts="$V31_PIN/uts" \
      chroot "$V31_ROOT" "${V31_ENV[@]}" \
      socat "UNIX-LISTEN:$V31_RAPI_SOCK,fork,unlink-early,mode=600" "TCP4:127.0.0.1:$V31_RAPI_INNER_PORT" \
      </dev/null >>"$V31_PIN/rapi-forward.log" 2>&1 &
    echo $! >"$V31_PIN/rapi-inner.pid"
  fi
  if ! v31_pid_is "$V31_PIN/rapi-outer.pid" "TCP4-LISTEN:$V31_RAPI_PORT"; then
    if (exec 3<>"/dev/tcp/127.0.0.1/$V31_RAPI_PORT") 2>/dev/null; then
      fail "something else listens on 127.0.0.1:$V31_RAPI_PORT"
    fi
    setsid nsenter --mount="$V31_PIN/mnt" chroot "$V31_ROOT" "${V31_ENV[@]}" \
      socat "TCP4-LISTEN:$V31_RAPI_PORT,bind=127.0.0.1,reuseaddr,fork,backlog=1024" "UNIX-CONNECT:$V31_RAPI_SOCK" \
      </dev/null >>"$V31_PIN/rapi-forward.log" 2>&1 &
    echo $! >"$V31_PIN/rapi-outer.pid"
  fi
  local i code=000
  for i in $(seq 1 120); do [ "$(v31_rapi_code GET /2/info)" = 200 ] && break; sleep 0.25; done
  [ "$(v31_rapi_code GET /2/info)" = 200 ] || fail "the 3.1 RAPI does not answer on https://127.0.0.1:$V31_RAPI_PORT"
  for i in $(seq 1 40); do   # the users file is re-read asynchronously
    code=$(v31_rapi_code PUT '/2/redistribute-config?dry-run=1')
    [ "$code" = 200 ] && return 0
    sleep 0.25
  done
  fail "RAPI user $RAPI_USER has no write access on https://127.0.0.1:$V31_RAPI_PORT (HTTP $code)"
}

# ---------------------------------------------------------------- commands
v31_up() {
  local t0 t1 t2 t3
  t0=$(now)
  v31_host_tools
  v31_chroot
  t1=$(now)
  v31_packages
  t2=$(now)
  v31_config
  v31_namespaces
  v31_cluster
  v31_rapi
  t3=$(now)
  say "up (Ganeti 3.1, 1 node, chroot $V31_ROOT) in $(since "$t0") s (debootstrap $(span "$t0" "$t1") s, packages $(span "$t1" "$t2") s, cluster $(span "$t2" "$t3") s): RAPI https://127.0.0.1:$V31_RAPI_PORT user $RAPI_USER (write), CA $V31_ROOT/var/lib/ganeti/rapi.pem"
}

# v31_down [--purge|--purge-root]: end the lab's processes by PID (both forwarder halves included),
# delete its netns, release the pins; --purge wipes the cluster state in the chroot (the next up runs
# gnt-cluster init), --purge-root deletes the chroot too. Never touches the 3.0 testbed.
v31_down() {
  local t0 pids p spec left="" i more f
  t0=$(now)
  pids=$(v31_pids | sort -un | tr '\n' ' ')
  # the forwarder halves by pidfile too (the namespaces may be gone), if the PID is that socat
  for spec in "rapi-outer.pid TCP4-LISTEN:$V31_RAPI_PORT,bind=127.0.0.1" "rapi-inner.pid UNIX-LISTEN:$V31_RAPI_SOCK"; do
    if v31_pid_is "$V31_PIN/${spec%% *}" "^socat .*${spec#* }"; then pids="$pids $(cat "$V31_PIN/${spec%% *}")"; fi
  done
  pids=$(printf '%s\n' $pids | sort -un | tr '\n' ' ')
  if [ -n "${pids// /}" ]; then
    kill -TERM $pids 2>/dev/null || true
    for i in $(seq 1 50); do
      left=$(v31_alive $pids | tr '\n' ' ')
      [ -z "${left// /}" ] && break
      sleep 0.1
    done
    if [ -n "${left// /}" ]; then kill -KILL $left 2>/dev/null || true; sleep 0.3; fi
    # whatever a daemon forked meanwhile (job executors) is in the same namespaces
    more=$(v31_alive $(v31_pids) | sort -un | tr '\n' ' ')
    if [ -n "${more// /}" ]; then kill -KILL $more 2>/dev/null || true; sleep 0.3; fi
  fi
  if v31_netns_exists; then
    left=$(v31_alive $(ip netns pids "$V31_NS" 2>/dev/null) | tr '\n' ' ')
    [ -z "${left// /}" ] || fail "processes still in netns $V31_NS ($left)"
    ip netns del "$V31_NS"
  fi
  for f in mnt uts; do
    if mountpoint -q "$V31_PIN/$f" 2>/dev/null; then umount "$V31_PIN/$f"; fi
  done
  if [ -d "$V31_PIN" ]; then
    if mountpoint -q "$V31_PIN"; then umount "$V31_PIN"; fi
    rm -f "$V31_PIN/mnt" "$V31_PIN/uts" "$V31_PIN"/*.pid
    rm -rf --one-file-system "$V31_PIN/run"   # the chroot's /run: as after a reboot
    if [ -f "$V31_PIN/rapi-forward.log" ]; then mv -f "$V31_PIN/rapi-forward.log" /tmp/ganeti-testbed-31-rapi-forward.log; fi
    rmdir "$V31_PIN" 2>/dev/null || true
  fi
  if [ -n "${1:-}" ] && { [ -d "$V31_ROOT" ] || [ -d "$V31_ROOT.new" ]; }; then
    # the lab's /proc, /sys, /dev and /run mounts exist only in its own mount namespace: refuse if the
    # machine's mount table shows one under the chroot all the same; --one-file-system as a second guard
    if awk -v r="$V31_ROOT" '$5 == r || index($5, r "/") == 1 || index($5, r ".new") == 1 {found = 1} END {exit !found}' \
      /proc/self/mountinfo; then
      fail "something is mounted under $V31_ROOT: not purging"
    fi
    rm -rf --one-file-system "$V31_ROOT"/var/lib/ganeti/* "$V31_ROOT"/var/log/ganeti/* \
      "$V31_ROOT$FILE_DIR"/* "$V31_ROOT$SHARED_FILE_DIR"/*
    if [ "$1" = --purge-root ]; then rm -rf --one-file-system "$V31_ROOT" "$V31_ROOT.new"; fi
  fi
  say "down (Ganeti 3.1${1:+, $1}) in $(since "$t0") s"
}

v31_status() { [ "$(v31_rapi_code GET /2/info)" = 200 ]; }

v31_ns() {
  v31_up_already || fail "the 3.1 testbed is not up: run '$0 up --version 3.1'"
  [ $# -gt 0 ] || set -- bash
  v31_in "$@"
}

v31_env() {
  echo "export SGTB_VERSION=3.1"
  echo "export SYNNEFO_GANETI_TEST_RAPI_URL=https://127.0.0.1:$V31_RAPI_PORT"
  echo "export SYNNEFO_GANETI_TEST_RAPI_USER=$RAPI_USER"
  echo "export SYNNEFO_GANETI_TEST_RAPI_PASSWORD=$RAPI_PASSWORD"
  echo "export SYNNEFO_GANETI_TEST_RAPI_CA=$V31_ROOT/var/lib/ganeti/rapi.pem"
  echo "export SYNNEFO_GANETI_TEST_NODE=$V31_NODE"
  echo "export SYNNEFO_GANETI_TEST_NODES=$V31_NODE"
  echo "export SYNNEFO_GANETI_TEST_QUEUE=$V31_ROOT/var/lib/ganeti/queue"
}
