# shellcheck shell=bash
# Sourced by ab_runs.sh and e2e_plan.sh: whether an offline site (the bring-up's bundles, lab/gpu/README.md) is
# installed whole. A site is complete once its last part is in: a staged part leaves .stage until then. Work
# started during the bring-up may find the 0.32.0 site still arriving: on 2026-12-03 the e2e panel's references
# were built from half a site, failed at once, and their pairs waited 400 s for them.
site_ready() { [ -d "$1/vllm" ] && [ ! -d "$1/.stage" ]; }
wait_site() {  # wait_site SITE WHO: returns once SITE is complete; after SITE_WAIT_S (300) s, 1 and a line on stderr
    local w=0
    until site_ready "$1"; do
        [ $w -ge "${SITE_WAIT_S:-300}" ] && { echo "$2: $1 is not complete after $w s" >&2; return 1; }
        sleep 2; w=$((w + 2))
    done
}
