package fleet

// SetFewNamespacesForTest sets where Up switches from asking about each
// namespace to reading the machine-wide tables, so that tests of a few
// namespaces run both paths; it returns the previous value.
func SetFewNamespacesForTest(n int) int {
	old := fewNamespaces
	fewNamespaces = n
	return old
}
