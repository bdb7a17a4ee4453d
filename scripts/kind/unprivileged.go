// Corral's patch to kind's docker provider (copied in by scripts/toolchain.sh kind).
//
// Some hosts refuse `--privileged`: on the VMs Corral is built on no process has CAP_SYS_RESOURCE, so runc fails
// with "unable to apply caps: operation not permitted" for every privileged container or exec. With
// CORRAL_KIND_UNPRIVILEGED=1 kind asks for the same powers without it: every capability the engine may grant, no
// seccomp/AppArmor confinement, writable /proc and /sys (systempaths=unconfined), every device and /dev/kmsg
// (kind adds /dev/fuse and --cgroupns=private itself). The node image's entrypoint remounts the cgroup v1 hierarchies read-write, which --privileged
// would have done. Without the variable kind behaves exactly as upstream.
package docker

import "os"

func unprivileged(args []string) []string {
	if os.Getenv("CORRAL_KIND_UNPRIVILEGED") != "1" {
		return args
	}
	out := make([]string, 0, len(args)+12)
	for _, a := range args {
		if a != "--privileged" {
			out = append(out, a)
			continue
		}
		if len(args) > 0 && args[0] == "exec" {
			continue // docker exec inherits the container's capabilities
		}
		out = append(out,
			"--cap-add=ALL", "--cap-drop=SYS_RESOURCE",
			"--security-opt=systempaths=unconfined",
			"--device-cgroup-rule=a *:* rwm",
			"--device=/dev/kmsg",
		)
	}
	return out
}
