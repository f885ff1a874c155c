//go:build !linux

package failover

import "os/exec"

func setProcAttr(*exec.Cmd) {}
