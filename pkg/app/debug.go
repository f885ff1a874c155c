package app

import "flag"

// debugFlags are serve's diagnostics on the admin port.
type debugFlags struct {
	pprof bool
}

func (d *debugFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&d.pprof, "pprof", false, "serve net/http/pprof under /debug/pprof/ on the admin port (profiles show the command line and cost CPU while they run)")
}
