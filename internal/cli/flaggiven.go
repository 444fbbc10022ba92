package cli

import "flag"

// flagGiven reports whether the command line set the flag name, so that a
// default may depend on other flags without overriding the user's choice.
func flagGiven(fs *flag.FlagSet, name string) bool {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}
