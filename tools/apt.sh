# Sourced by tools/services.d/*.sh: install Debian packages, running `apt-get update` at most once per run.
apt_install() {
  if [ ! -f /tmp/.redline-apt-updated ]; then
    apt-get update -qq >/dev/null && touch /tmp/.redline-apt-updated
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}
