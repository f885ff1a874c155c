package pressure

import "github.com/tollgate-dev/tollgate/pkg/admission"

// The Gate and the Controller are the admission pipeline's Shedder and
// Admissions; the pipeline's interfaces live above them, so the check is
// here rather than in the code it would otherwise make import admission.
var (
	_ admission.Shedder    = (*Gate)(nil)
	_ admission.Admissions = (*Controller)(nil)
)
