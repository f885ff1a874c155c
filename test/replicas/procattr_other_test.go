//go:build !linux

package replicas

import "os/exec"

func setProcAttr(*exec.Cmd) {}
