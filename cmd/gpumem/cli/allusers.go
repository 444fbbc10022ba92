package cli

import (
	"flag"

	"github.com/gpumem/gpumem/sidecar/discovery"
	"github.com/gpumem/gpumem/sidecar/procs"
)

// flagGiven reports whether the command line set the flag name, so that a
// default may depend on other flags without overriding the user's choice.
func flagGiven(fs *flag.FlagSet, name string) bool {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}

// allUserDirs is serve --all-users' finder of every user's runtime dirs
// (only those of users, when given), or nil without --all-users.
func allUserDirs(on bool, users []string, proc *procs.FS) func() ([]discovery.UserDir, []error) {
	if !on {
		return nil
	}
	return func() ([]discovery.UserDir, []error) {
		return discovery.FindUserRuntimeDirs(discovery.UserDirsOptions{Procs: proc, Users: users})
	}
}
