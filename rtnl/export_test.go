package rtnl

// ParseLinkForTest exposes parseLink to the fuzz target.
var ParseLinkForTest = parseLink
