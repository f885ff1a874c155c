package tollgatetest

import (
	"os/exec"
	"syscall"
)

// setProcAttr makes the kernel kill tollgate when the test binary dies
// without running its cleanups (a panic, a timeout, SIGKILL).
func setProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
