# expect: invalid class
